import { memo, useRef, useState } from 'react';
import ReactMarkdown from 'react-markdown';
import remarkGfm from 'remark-gfm';

// Markdown as it streams: each update re-renders the text so far, so an unclosed code block or a
// half-written table shows as one while it arrives. Raw HTML in model output is never rendered.
// A code block with a Copy button, as people expect of a chat page.
function CodeBlock({ node, ...props }) {
  const block = useRef(null);
  const [copied, setCopied] = useState(false);
  async function copy() {
    try {
      await navigator.clipboard.writeText(block.current?.innerText ?? '');
      setCopied(true);
      setTimeout(() => setCopied(false), 1500);
    } catch {
      setCopied(false);
    }
  }
  return (
    <div className="code-block">
      <button type="button" className="small copy-code" onClick={copy} aria-label="Copy the code">
        {copied ? 'Copied' : 'Copy'}
      </button>
      <pre ref={block} {...props} />
    </div>
  );
}

const components = {
  pre: CodeBlock,
  a: ({ node, ...props }) => <a {...props} target="_blank" rel="noopener noreferrer nofollow" />,
  table: ({ node, ...props }) => (
    <div className="table-scroll">
      <table {...props} />
    </div>
  ),
};

function Markdown({ text }) {
  return (
    <div className="markdown">
      <ReactMarkdown remarkPlugins={[remarkGfm]} components={components}>
        {text}
      </ReactMarkdown>
    </div>
  );
}

export default memo(Markdown);
