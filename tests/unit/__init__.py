"""Unit tests: functions against oracles (dense matrices, closed forms, properties)."""
