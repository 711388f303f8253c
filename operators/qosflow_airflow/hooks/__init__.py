"""Hooks of the qosflow provider."""
