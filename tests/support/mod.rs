//! Shared helpers for the system tests in tests/.
