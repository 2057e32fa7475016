# The reference assistant in a container. A container is not loopback, so development sign-in is off:
# pass a Supabase project (SUPABASE_URL and its keys) and a Postgres (DATABASE_URL), for example
#   docker build -t bastion . && docker run -p 8000:8000 -e DATABASE_URL=... -e SUPABASE_URL=... \
#     -e SUPABASE_PUBLISHABLE_KEY=... bastion
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
RUN pip install --no-cache-dir -c constraints.txt '.[assistant]'
ENV BASTION_HOST=0.0.0.0 \
    BASTION_PORT=8000 \
    BASTION_DATA_DIR=/data
EXPOSE 8000
USER nobody
CMD ["bastion", "serve"]
