//! The harness itself: a real standalone server answers, and a real
//! three-master Cluster serves every slot and redirects.

mod support {
    #[allow(dead_code)]
    pub mod redis;
}

use support::redis::{RedisCluster, RedisServer, command};

#[test]
fn a_standalone_server_starts_answers_and_stops() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let port = server.port();
    assert_eq!(command(port, &["SET", "tollgate", "1"]).unwrap(), "+OK");
    assert_eq!(command(port, &["GET", "tollgate"]).unwrap(), "1");
    drop(server);
    assert!(
        command(port, &["PING"]).is_err(),
        "the server outlived its handle"
    );
}

#[test]
fn a_three_master_cluster_serves_every_slot() {
    let cluster = RedisCluster::start().unwrap_or_else(|error| panic!("{error}"));
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    for &port in &ports {
        let info = command(port, &["CLUSTER", "INFO"]).unwrap();
        assert!(info.contains("cluster_known_nodes:3"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
    }
    // A key lives on one master; the others answer with a redirection.
    let replies: Vec<String> = ports
        .iter()
        .map(|&port| command(port, &["SET", "tollgate", "1"]).unwrap())
        .collect();
    assert_eq!(
        replies.iter().filter(|reply| *reply == "+OK").count(),
        1,
        "{replies:?}"
    );
    assert_eq!(
        replies
            .iter()
            .filter(|reply| reply.starts_with("-MOVED "))
            .count(),
        2,
        "{replies:?}"
    );
}
