//! named-glue (work in progress).
