"""Helpers the test modules share (issue 13 moves factories and the signed client here too)."""
