"""Op family: nn (see docs/ir.md)."""
