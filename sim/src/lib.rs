//! Deterministic chaos simulation of the proxy (turmoil). Skeleton until its issue lands.
