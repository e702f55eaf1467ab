# The image of every role: `threadline <role>` (processor, worker, gateway, connector).
# docker-compose.yml builds it for one host; deploy/helm/threadline runs it on Kubernetes.
FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir -e . \
 && useradd --uid 10001 --user-group --home-dir /var/lib/threadline --create-home threadline
# Not root; the data folder (THREADLINE_DATA_DIR) is a volume in production.
USER 10001
WORKDIR /var/lib/threadline
ENV THREADLINE_DATA_DIR=/var/lib/threadline
ENTRYPOINT ["threadline"]
CMD ["run"]
