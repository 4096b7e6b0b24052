"""DVC stage commands: thin CLIs over posenc."""
