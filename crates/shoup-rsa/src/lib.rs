//! shoup-rsa (work in progress).
