"""One module per command group: train (the headless run), presets, runs."""
