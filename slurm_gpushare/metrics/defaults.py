"""The exporter's defaults, in a module of their own so the CLI shows them without importing prometheus_client."""

DEFAULT_PORT = 9877
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"  # this host only: beyond it, TLS or --web.insecure-plain-http
DEFAULT_INTERVAL = 15.0  # seconds between two reads of Slurm at most: Prometheus' default scrape interval is 15-60 s
DEFAULT_TIMEOUT = 10.0  # seconds one Slurm command may run (Prometheus' default scrape_timeout is 10 s)
