"""Scenarios, one module each, registered explicitly below."""
