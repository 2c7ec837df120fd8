"""Widgets with a job of their own: the plots, the memory panel, the attempts panel."""
