"""The reference assistant: an application built on bastion, served by `bastion serve`."""
