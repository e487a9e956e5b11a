"""Convolution on the CPU: plan (method and tile), pack (weights), and one emitter per method."""
