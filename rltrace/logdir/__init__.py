"""The run's log dir: its layout, files opened without following links, pid-named files."""
