"""Modal screens of the dashboard."""
