//! tollgate's contract over Redis (issue 9, in progress): one server-side
//! script per algorithm, called by hash in one round trip, deciding in
//! integer microseconds. This first step is the test harness that runs a
//! real `redis-server`, standalone and as a three-master Cluster, on free
//! loopback ports (`tests/support/redis.rs`).
