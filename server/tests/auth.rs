//! Authentication end to end, on cairn alone (the differential test compares the common
//! ground with etcd): the callers etcd 3.6 relaxed the rules for (Status, MemberList and alarm
//! listing for any authenticated user, AuthStatus for anyone); what a simple token is worth
//! after its user's password changes or a role is revoked, and after its TTL; JWT tokens signed
//! with RS256 and ES256 keys, refused once the auth store moves on; the client certificate's
//! common name as the user; the auth store across a restart and through a snapshot restored
//! into a new member; and bad input (malformed tokens, oversized names and passwords).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::path::Path;
use std::time::Duration;

use cairn_server::pb::authpb;
use cairn_server::pb::etcdserverpb as pb;
use cairn_server::pb::etcdserverpb::auth_client::AuthClient;
use cairn_server::pb::etcdserverpb::cluster_client::ClusterClient;
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use common::Member;
use prost::bytes::Bytes;
use tonic::transport::Channel;
use tonic::Code;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn channel(member: &Member) -> Channel {
    Channel::from_shared(member.client_url())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn with<T>(token: Option<&str>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(t) = token {
        request.metadata_mut().insert("token", t.parse().unwrap());
    }
    request
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Runs an etcdctl command: whether it succeeded, and its stdout then stderr.
fn outcome(mut command: std::process::Command) -> (bool, String) {
    let output = command.stdin(std::process::Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>, code: Code, message: &str) {
    match r {
        Ok(ok) => panic!("expected {code:?} {message:?}, got {ok:?}"),
        Err(s) => assert_eq!((s.code(), s.message()), (code, message), "{s:?}"),
    }
}

/// root (with the root role), `alice` with role `app` (read-write on `app/`), and `bob` with
/// no role; auth enabled.
async fn users(ch: &Channel) {
    let mut auth = AuthClient::new(ch.clone());
    for (name, password) in [("root", "rootpw"), ("alice", "alicepw"), ("bob", "bobpw")] {
        auth.user_add(pb::AuthUserAddRequest {
            name: name.into(),
            password: password.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    auth.role_add(pb::AuthRoleAddRequest { name: "root".into() })
        .await
        .unwrap();
    auth.role_add(pb::AuthRoleAddRequest { name: "app".into() })
        .await
        .unwrap();
    auth.role_grant_permission(pb::AuthRoleGrantPermissionRequest {
        name: "app".into(),
        perm: Some(authpb::Permission {
            perm_type: authpb::permission::Type::Readwrite as i32,
            key: b("app/"),
            range_end: b("app0"),
        }),
    })
    .await
    .unwrap();
    for (user, role) in [("root", "root"), ("alice", "app")] {
        auth.user_grant_role(pb::AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
        .await
        .unwrap();
    }
    auth.auth_enable(pb::AuthEnableRequest {}).await.unwrap();
}

async fn token(ch: &Channel, name: &str, password: &str) -> String {
    AuthClient::new(ch.clone())
        .authenticate(pb::AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token
}

async fn put(ch: &Channel, token: Option<&str>, key: &str) -> Result<tonic::Response<pb::PutResponse>, tonic::Status> {
    let request = pb::PutRequest {
        key: b(key),
        value: b("v"),
        ..Default::default()
    };
    KvClient::new(ch.clone()).put(with(token, request)).await
}

#[test]
fn any_authenticated_user_may_read_status_members_and_alarms_and_anyone_auth_status() {
    let member = Member::start("relaxed", &["--bcrypt-cost", "4"]);
    runtime().block_on(async {
        let ch = channel(&member).await;
        users(&ch).await;
        let bob = token(&ch, "bob", "bobpw").await;
        let mut maintenance = MaintenanceClient::new(ch.clone());
        let mut cluster = ClusterClient::new(ch.clone());
        // bob holds no role, but is authenticated.
        maintenance
            .status(with(Some(&bob), pb::StatusRequest {}))
            .await
            .unwrap();
        cluster
            .member_list(with(Some(&bob), pb::MemberListRequest::default()))
            .await
            .unwrap();
        let list = pb::AlarmRequest::default();
        maintenance.alarm(with(Some(&bob), list)).await.unwrap();
        // Nobody at all: refused, except AuthStatus.
        refused(
            maintenance.status(with(None, pb::StatusRequest {})).await,
            Code::InvalidArgument,
            "etcdserver: user name is empty",
        );
        refused(
            maintenance.alarm(with(None, list)).await,
            Code::InvalidArgument,
            "etcdserver: user name is empty",
        );
        let status = AuthClient::new(ch.clone())
            .auth_status(pb::AuthStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(status.enabled);
        // What only an admin may do.
        refused(
            maintenance.defragment(with(Some(&bob), pb::DefragmentRequest {})).await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        let compact = pb::CompactionRequest {
            revision: 1,
            physical: false,
        };
        refused(
            KvClient::new(ch.clone()).compact(with(Some(&bob), compact)).await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        let add = pb::MemberAddRequest {
            peer_ur_ls: vec!["http://127.0.0.1:1".into()],
            is_learner: true,
        };
        refused(
            cluster.member_add(with(Some(&bob), add)).await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        refused(
            AuthClient::new(ch.clone())
                .user_list(with(Some(&bob), pb::AuthUserListRequest {}))
                .await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        // A user reads itself, and a role it holds.
        let alice = token(&ch, "alice", "alicepw").await;
        let mut auth = AuthClient::new(ch.clone());
        let me = auth
            .user_get(with(Some(&alice), pb::AuthUserGetRequest { name: "alice".into() }))
            .await
            .unwrap();
        assert_eq!(me.into_inner().roles, vec!["app".to_string()]);
        auth.role_get(with(Some(&alice), pb::AuthRoleGetRequest { role: "app".into() }))
            .await
            .unwrap();
        refused(
            auth.role_get(with(Some(&alice), pb::AuthRoleGetRequest { role: "root".into() }))
                .await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
    });
}

#[test]
fn simple_tokens_die_with_a_password_change_keep_no_revoked_role_and_expire() {
    let member = Member::start("tokens", &["--bcrypt-cost", "4", "--auth-token-ttl", "2"]);
    runtime().block_on(async {
        let ch = channel(&member).await;
        users(&ch).await;
        let root = token(&ch, "root", "rootpw").await;
        let alice = token(&ch, "alice", "alicepw").await;
        put(&ch, Some(&alice), "app/1").await.unwrap();
        refused(
            put(&ch, Some(&alice), "other").await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        // A revoked role: the token still names alice, who may no longer write.
        let mut auth = AuthClient::new(ch.clone());
        let revoke = pb::AuthUserRevokeRoleRequest {
            name: "alice".into(),
            role: "app".into(),
        };
        auth.user_revoke_role(with(Some(&root), revoke)).await.unwrap();
        refused(
            put(&ch, Some(&alice), "app/1").await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        // A new password: every token of the user is gone.
        let change = pb::AuthUserChangePasswordRequest {
            name: "alice".into(),
            password: "new".into(),
            hashed_password: String::new(),
        };
        auth.user_change_password(with(Some(&root), change)).await.unwrap();
        refused(
            put(&ch, Some(&alice), "app/1").await,
            Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
        let old = AuthClient::new(ch.clone())
            .authenticate(pb::AuthenticateRequest {
                name: "alice".into(),
                password: "alicepw".into(),
            })
            .await;
        refused(
            old,
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        );
        // Unused for longer than --auth-token-ttl (2 s), a token expires.
        let bob = token(&ch, "bob", "bobpw").await;
        let mut maintenance = MaintenanceClient::new(ch.clone());
        maintenance
            .status(with(Some(&bob), pb::StatusRequest {}))
            .await
            .unwrap();
        // Expiry is time passing unused: nothing to await but the time (exact clocks are the
        // engine's unit test of the tokens).
        tokio::time::sleep(Duration::from_secs(3)).await;
        refused(
            maintenance.status(with(Some(&bob), pb::StatusRequest {})).await,
            Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
    });
}

/// An ES256 key pair as PEM files in `dir`: (private, public).
fn es256_keys(dir: &Path) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let private = dir.join("es256.pem");
    let public = dir.join("es256.pub.pem");
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    (private.display().to_string(), public.display().to_string())
}

#[test]
fn jwt_tokens_signed_with_rs256_and_es256_are_refused_once_the_auth_store_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt");
    let rs256 = format!(
        "jwt,pub-key={},priv-key={},sign-method=RS256,ttl=10m",
        fixtures.join("rs256-public.pem").display(),
        fixtures.join("rs256-private.pem").display()
    );
    let (private, public) = es256_keys(dir.path());
    let es256 = format!("jwt,pub-key={public},priv-key={private},sign-method=ES256");
    for option in [rs256, es256] {
        let member = Member::start("jwt", &["--bcrypt-cost", "4", "--auth-token", &option]);
        runtime().block_on(async {
            let ch = channel(&member).await;
            users(&ch).await;
            let alice = token(&ch, "alice", "alicepw").await;
            assert_eq!(alice.split('.').count(), 3, "a JWT: {alice}");
            put(&ch, Some(&alice), "app/1").await.unwrap();
            refused(
                put(&ch, Some(&alice), "elsewhere").await,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            );
            // Any change to the auth store: a JWT names the revision it was issued at.
            let root = token(&ch, "root", "rootpw").await;
            let role = pb::AuthRoleAddRequest { name: "more".into() };
            AuthClient::new(ch.clone())
                .role_add(with(Some(&root), role))
                .await
                .unwrap();
            refused(
                put(&ch, Some(&alice), "app/1").await,
                Code::InvalidArgument,
                "etcdserver: revision of auth store is old",
            );
            let fresh = token(&ch, "alice", "alicepw").await;
            put(&ch, Some(&fresh), "app/1").await.unwrap();
            // A token signed with another key, or tampered with.
            let forged = format!("{}x", fresh);
            refused(
                put(&ch, Some(&forged), "app/1").await,
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            );
        });
    }
}

#[test]
fn the_client_certificates_common_name_is_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let ca = pki::Ca::new(dir.path(), "main");
    let server = ca.issue("server", "cairn", &["127.0.0.1"], pki::Usage::Both);
    let root_cert = ca.issue("root", "root", &[], pki::Usage::Client);
    let alice_cert = ca.issue("alice", "alice", &[], pki::Usage::Client);
    let mut flags = pki::mtls_flags(&ca, &server);
    flags.push("--bcrypt-cost=4".to_string());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let member = Member::start_https("certs", &flags);
    let etcdctl = |pair: &pki::Pair, args: &[&str]| {
        let tls = [
            format!("--cacert={}", ca.cert()),
            format!("--cert={}", pair.cert()),
            format!("--key={}", pair.key()),
        ];
        let all: Vec<&str> = tls.iter().map(String::as_str).chain(args.iter().copied()).collect();
        outcome(common::etcdctl_of(
            Path::new(common::ETCDCTL),
            &member.client_url(),
            &all,
        ))
    };
    // Users with no password: certificates only.
    for args in [
        &["user", "add", "root", "--no-password"][..],
        &["user", "add", "alice", "--no-password"],
        &["role", "add", "root"],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "app"],
        &["role", "grant-permission", "app", "readwrite", "app/", "--prefix=true"],
        &["user", "grant-role", "alice", "app"],
        &["auth", "enable"],
    ] {
        let (ok, out) = etcdctl(&root_cert, args);
        assert!(ok, "{args:?}: {out}");
    }
    let (ok, out) = etcdctl(&alice_cert, &["put", "app/1", "v"]);
    assert!(ok, "{out}");
    let (ok, out) = etcdctl(&alice_cert, &["put", "other", "v"]);
    assert!(!ok && out.contains("etcdserver: permission denied"), "{out}");
    let (ok, out) = etcdctl(&root_cert, &["put", "other", "v"]);
    assert!(ok, "{out}");
    let (ok, out) = etcdctl(&alice_cert, &["user", "list"]);
    assert!(!ok && out.contains("etcdserver: permission denied"), "{out}");
}

#[test]
fn the_auth_store_survives_a_restart_and_travels_in_a_snapshot() {
    let mut member = Member::start("durable", &["--bcrypt-cost", "4"]);
    let snapshot = member.data_dir.with_file_name("auth.snapshot");
    runtime().block_on(async {
        let ch = channel(&member).await;
        users(&ch).await;
    });
    member.stop();
    member.restart();
    runtime().block_on(async {
        let ch = channel(&member).await;
        // Tokens live in memory: authenticate again, with the same passwords.
        let alice = token(&ch, "alice", "alicepw").await;
        put(&ch, Some(&alice), "app/after-restart").await.unwrap();
        refused(
            put(&ch, None, "app/x").await,
            Code::InvalidArgument,
            "etcdserver: user name is empty",
        );
        let root = token(&ch, "root", "rootpw").await;
        let mut stream = MaintenanceClient::new(ch.clone())
            .snapshot(with(Some(&root), pb::SnapshotRequest {}))
            .await
            .unwrap()
            .into_inner();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            bytes.extend_from_slice(&chunk.blob);
        }
        std::fs::write(&snapshot, bytes).unwrap();
    });
    let snapshot_path = snapshot.display().to_string();
    let restored = Member::start_prepared("restored", &["--bcrypt-cost", "4"], |dir, peer_url| {
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["snapshot", "restore", &snapshot_path, "--name", "restored"])
            .arg("--data-dir")
            .arg(dir)
            .args(["--initial-advertise-peer-urls", peer_url])
            .args(["--initial-cluster", &format!("restored={peer_url}")])
            .status()
            .unwrap();
        assert!(status.success());
    });
    runtime().block_on(async {
        let ch = channel(&restored).await;
        let status = AuthClient::new(ch.clone())
            .auth_status(pb::AuthStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(status.enabled, "auth comes back on with the snapshot");
        let alice = token(&ch, "alice", "alicepw").await;
        put(&ch, Some(&alice), "app/restored").await.unwrap();
        refused(
            put(&ch, Some(&alice), "nope").await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
    });
}

#[test]
fn malformed_tokens_and_oversized_names_and_passwords_get_clear_errors() {
    let member = Member::start("bad-input", &["--bcrypt-cost", "4"]);
    runtime().block_on(async {
        let ch = channel(&member).await;
        users(&ch).await;
        let long = "x".repeat(8_000);
        for token in ["", "garbage", "a.b.c", "Bearer ", &long, "no-index.", "x.1"] {
            refused(
                put(&ch, Some(token), "app/1").await,
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            );
        }
        // Past HTTP/2's header list limit (16 KiB), the transport refuses the request itself.
        let huge = "x".repeat(100_000);
        let r = put(&ch, Some(&huge), "app/1").await;
        assert_eq!(r.unwrap_err().code(), Code::ResourceExhausted);
        let root = token(&ch, "root", "rootpw").await;
        let mut auth = AuthClient::new(ch.clone());
        let huge_name = pb::AuthUserAddRequest {
            name: "n".repeat(5000),
            password: "pw".into(),
            ..Default::default()
        };
        let r = auth.user_add(with(Some(&root), huge_name)).await;
        assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);
        let huge_password = pb::AuthUserAddRequest {
            name: "carol".into(),
            password: "p".repeat(100),
            ..Default::default()
        };
        let r = auth.user_add(with(Some(&root), huge_password)).await;
        assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);
        let r = auth
            .authenticate(pb::AuthenticateRequest {
                name: "root".into(),
                password: "p".repeat(10_000),
            })
            .await;
        refused(
            r,
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        );
        // Nothing was lost, and the member still serves.
        let users = auth
            .user_list(with(Some(&root), pb::AuthUserListRequest {}))
            .await
            .unwrap();
        assert_eq!(users.into_inner().users, vec!["alice", "bob", "root"]);
    });
}

#[test]
fn etcdctl_3_4_and_3_5_authenticate_with_user_and_password() {
    let member = Member::start("etcdctl-auth", &["--bcrypt-cost", "4"]);
    runtime().block_on(async {
        let ch = channel(&member).await;
        users(&ch).await;
    });
    let v35 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/etcd-3.5/etcdctl");
    for bin in [Path::new(common::ETCDCTL), v35.as_path()] {
        let run = |args: &[&str]| outcome(common::etcdctl_of(bin, &member.client_url(), args));
        let (ok, out) = run(&["--user=alice:alicepw", "put", "app/x", "1"]);
        assert!(ok, "{}: {out}", bin.display());
        let (ok, out) = run(&[
            "--user=alice",
            "--password=alicepw",
            "get",
            "app/x",
            "--print-value-only",
        ]);
        assert!(ok && out.trim() == "1", "{}: {out}", bin.display());
        let (ok, out) = run(&["--user=alice:alicepw", "put", "elsewhere", "1"]);
        assert!(
            !ok && out.contains("etcdserver: permission denied"),
            "{}: {out}",
            bin.display()
        );
        let (ok, out) = run(&["--user=alice:wrong", "get", "app/x"]);
        assert!(
            !ok && out.contains("etcdserver: authentication failed, invalid user ID or password"),
            "{}: {out}",
            bin.display()
        );
        let (ok, out) = run(&["get", "app/x"]);
        assert!(
            !ok && out.contains("etcdserver: user name is empty"),
            "{}: {out}",
            bin.display()
        );
        let (ok, out) = run(&["--user=root:rootpw", "user", "list"]);
        assert!(
            ok && out.lines().collect::<Vec<_>>() == ["alice", "bob", "root"],
            "{}: {out}",
            bin.display()
        );
    }
}
