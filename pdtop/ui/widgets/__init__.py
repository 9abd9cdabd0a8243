"""The dashboard's panels, one widget per file. Each repaints from a `DashboardState`."""
