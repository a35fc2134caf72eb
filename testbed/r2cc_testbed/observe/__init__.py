"""What an operator's monitoring sees of r2cc, for real: a Prometheus server with r2cc's alert
rules scraping a deployment on the lab (prometheus.py), and the Grafana dashboard's panels
queried and drawn from it (dashboard.py)."""
