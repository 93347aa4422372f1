"""Meshes, the one table of logical axis rules, sharded placement, and multi-host helpers."""
