"""Sensors of the qosflow provider."""
