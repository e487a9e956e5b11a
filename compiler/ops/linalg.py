"""Op family: linalg (see docs/ir.md)."""
