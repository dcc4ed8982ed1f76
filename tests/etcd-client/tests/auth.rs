//! cairn's Auth service driven by the `etcd-client` crate the way its own auth tests use it,
//! against a fresh single member per test (started with `--bcrypt-cost 4` so that hashing is
//! quick): users and roles (exact lists, roles and permissions, etcd's errors), enabling auth
//! (root with the root role), authenticating, a user limited to a prefix (KV, txn and watch),
//! clients without a token, a changed password or a deleted user refusing the old token, the
//! crate's re-authentication (`update_user`, `refresh_token`, a new `connect`), expired simple
//! tokens (`--auth-token-ttl`) and the crate's automatic token refresh, and disabling auth.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, ConnectOptions, DeleteOptions, GetOptions, Permission, RoleGetResponse, RoleRevokePermissionOptions, Txn,
    TxnOp, TxnOpResponse, UserAddOptions, WatchOptions,
};
use tonic::Code;

use common::{assert_status, next_message, Member, PATIENCE};

const USER_EMPTY: &str = "etcdserver: user name is empty";
const PERMISSION_DENIED: &str = "etcdserver: permission denied";
const INVALID_TOKEN: &str = "etcdserver: invalid auth token";
const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
const NOT_ENABLED: &str = "etcdserver: authentication is not enabled";
const USER_NOT_FOUND: &str = "etcdserver: user name not found";
const ROLE_NOT_FOUND: &str = "etcdserver: role name not found";
const INVALID_MGMT: &str = "etcdserver: invalid auth management";

const ROOT_PW: &str = "root-pw";

/// Starts a member with quick bcrypt hashing and `extra` flags.
async fn start(name: &str, extra: &[&str]) -> (Member, Client) {
    let mut args = vec!["--bcrypt-cost", "4"];
    args.extend_from_slice(extra);
    Member::start_with(name, &args).await
}

/// Connects to `member` as `user`: `Client::connect` authenticates before returning.
async fn connect_as(member: &Member, user: &str, password: &str) -> Result<Client, etcd_client::Error> {
    member
        .connect(Some(ConnectOptions::new().with_user(user, password)))
        .await
}

/// Adds root with the root role, and enables auth; returns a client authenticated as root.
async fn enable_with_root(member: &Member, c: &mut Client) -> Client {
    c.user_add("root", ROOT_PW, None).await.unwrap();
    c.role_add("root").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();
    connect_as(member, "root", ROOT_PW).await.unwrap()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(ToString::to_string).collect()
}

/// A role's permissions as (type, key, range_end), in the order the server lists them.
fn perms(resp: &RoleGetResponse) -> Vec<(&'static str, String, String)> {
    resp.permissions()
        .iter()
        .map(|p| {
            let kind = match p.get_type() {
                0 => "READ",
                1 => "WRITE",
                2 => "READWRITE",
                other => panic!("unknown permission type {other}"),
            };
            (
                kind,
                String::from_utf8_lossy(p.key()).into_owned(),
                String::from_utf8_lossy(p.range_end()).into_owned(),
            )
        })
        .collect()
}

fn perm(kind: &'static str, key: &str, range_end: &str) -> (&'static str, String, String) {
    (kind, key.to_string(), range_end.to_string())
}

fn keys(c: &etcd_client::GetResponse) -> Vec<String> {
    c.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

async fn value(c: &mut Client, key: &str) -> Option<String> {
    let r = c.get(key, None).await.unwrap();
    r.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

#[tokio::test]
async fn users_and_roles_are_managed_with_etcds_answers() {
    let (_member, mut c) = start("auth-mgmt", &[]).await;

    assert!(c.user_list().await.unwrap().users().is_empty());
    assert!(c.role_list().await.unwrap().roles().is_empty());

    // Users: added, listed sorted, duplicates and empty names refused.
    c.user_add("root", ROOT_PW, None).await.unwrap();
    c.user_add("bob", "bob-pw", Some(UserAddOptions::new())).await.unwrap();
    c.user_add("alice", "alice-pw", None).await.unwrap();
    c.user_add("nopw", "", Some(UserAddOptions::new().with_no_pwd()))
        .await
        .unwrap();
    assert_status(
        c.user_add("alice", "other", None).await,
        Code::FailedPrecondition,
        "etcdserver: user name already exists",
    );
    assert_status(c.user_add("", "pw", None).await, Code::InvalidArgument, USER_EMPTY);
    assert_eq!(
        c.user_list().await.unwrap().users(),
        strings(&["alice", "bob", "nopw", "root"])
    );

    // Roles: the same.
    c.role_add("root").await.unwrap();
    c.role_add("app").await.unwrap();
    c.role_add("ro").await.unwrap();
    assert_status(
        c.role_add("app").await,
        Code::FailedPrecondition,
        "etcdserver: role name already exists",
    );
    assert_status(
        c.role_add("").await,
        Code::InvalidArgument,
        "etcdserver: role name is empty",
    );
    assert_eq!(c.role_list().await.unwrap().roles(), strings(&["app", "ro", "root"]));

    // Permissions: a new role has none; granted ones are listed sorted by key, with their
    // exact range ends (the crate turns with_prefix into the prefix's end, with_from_key into
    // "\0"); granting the same range again changes its type in place.
    assert!(c.role_get("app").await.unwrap().permissions().is_empty());
    c.role_grant_permission("app", Permission::write("zzz").with_from_key())
        .await
        .unwrap();
    c.role_grant_permission("app", Permission::read_write("app/").with_prefix())
        .await
        .unwrap();
    c.role_grant_permission("app", Permission::read("shared"))
        .await
        .unwrap();
    c.role_grant_permission("app", Permission::read("m").with_range_end("n"))
        .await
        .unwrap();
    let app = c.role_get("app").await.unwrap();
    assert_eq!(
        perms(&app),
        vec![
            perm("READWRITE", "app/", "app0"),
            perm("READ", "m", "n"),
            perm("READ", "shared", ""),
            perm("WRITE", "zzz", "\0"),
        ]
    );
    // The crate's own view of them: prefix and from-key recognised.
    let crate_perms = app.permissions();
    assert!(crate_perms[0].is_prefix() && !crate_perms[0].is_from_key());
    assert!(crate_perms[3].is_from_key() && !crate_perms[3].is_prefix());
    c.role_grant_permission("app", Permission::write("shared"))
        .await
        .unwrap();
    assert_eq!(
        perms(&c.role_get("app").await.unwrap()),
        vec![
            perm("READWRITE", "app/", "app0"),
            perm("READ", "m", "n"),
            perm("WRITE", "shared", ""),
            perm("WRITE", "zzz", "\0"),
        ]
    );
    // The root role is listed with read-write on every key.
    assert_eq!(
        perms(&c.role_get("root").await.unwrap()),
        vec![perm("READWRITE", "", "\0")]
    );
    assert_status(c.role_get("nope").await, Code::FailedPrecondition, ROLE_NOT_FOUND);
    assert_status(
        c.role_grant_permission("nope", Permission::read("k")).await,
        Code::FailedPrecondition,
        ROLE_NOT_FOUND,
    );

    // Revoking: exactly the granted (key, range end), else "not granted".
    c.role_revoke_permission("app", "zzz", Some(RoleRevokePermissionOptions::new().with_from_key()))
        .await
        .unwrap();
    c.role_revoke_permission("app", "m", Some(RoleRevokePermissionOptions::new().with_range_end("n")))
        .await
        .unwrap();
    let not_granted = "etcdserver: permission is not granted to the role";
    assert_status(
        c.role_revoke_permission("app", "zzz", Some(RoleRevokePermissionOptions::new().with_from_key()))
            .await,
        Code::FailedPrecondition,
        not_granted,
    );
    // "app/" alone is not the granted prefix range.
    assert_status(
        c.role_revoke_permission("app", "app/", None).await,
        Code::FailedPrecondition,
        not_granted,
    );
    assert_status(
        c.role_revoke_permission("nope", "k", None).await,
        Code::FailedPrecondition,
        ROLE_NOT_FOUND,
    );
    assert_eq!(
        perms(&c.role_get("app").await.unwrap()),
        vec![perm("READWRITE", "app/", "app0"), perm("WRITE", "shared", "")]
    );

    // Granting roles to users: listed sorted; unknown users and roles refused; a role granted
    // twice is listed once.
    c.user_grant_role("root", "root").await.unwrap();
    c.user_grant_role("alice", "ro").await.unwrap();
    c.user_grant_role("alice", "app").await.unwrap();
    c.user_grant_role("alice", "app").await.unwrap();
    assert_status(
        c.user_grant_role("alice", "nope").await,
        Code::FailedPrecondition,
        ROLE_NOT_FOUND,
    );
    assert_status(
        c.user_grant_role("nobody", "app").await,
        Code::FailedPrecondition,
        USER_NOT_FOUND,
    );
    assert_eq!(c.user_get("alice").await.unwrap().roles(), strings(&["app", "ro"]));
    assert_eq!(c.user_get("root").await.unwrap().roles(), strings(&["root"]));
    assert!(c.user_get("bob").await.unwrap().roles().is_empty());
    assert_status(c.user_get("nobody").await, Code::FailedPrecondition, USER_NOT_FOUND);

    // Revoking a role.
    c.user_revoke_role("alice", "ro").await.unwrap();
    assert_status(
        c.user_revoke_role("alice", "ro").await,
        Code::FailedPrecondition,
        "etcdserver: role is not granted to the user",
    );
    assert_status(
        c.user_revoke_role("nobody", "ro").await,
        Code::FailedPrecondition,
        USER_NOT_FOUND,
    );
    assert_eq!(c.user_get("alice").await.unwrap().roles(), strings(&["app"]));

    // Deleting a role takes it away from the users that had it.
    c.role_add("tmp").await.unwrap();
    c.user_grant_role("bob", "tmp").await.unwrap();
    c.user_grant_role("alice", "tmp").await.unwrap();
    assert_eq!(c.user_get("alice").await.unwrap().roles(), strings(&["app", "tmp"]));
    c.role_delete("tmp").await.unwrap();
    assert!(c.user_get("bob").await.unwrap().roles().is_empty());
    assert_eq!(c.user_get("alice").await.unwrap().roles(), strings(&["app"]));
    c.role_delete("ro").await.unwrap();
    assert_status(c.role_delete("ro").await, Code::FailedPrecondition, ROLE_NOT_FOUND);
    assert_eq!(c.role_list().await.unwrap().roles(), strings(&["app", "root"]));

    // Passwords and deleting users.
    c.user_change_password("bob", "bob-pw-2").await.unwrap();
    assert_status(
        c.user_change_password("nobody", "pw").await,
        Code::FailedPrecondition,
        USER_NOT_FOUND,
    );
    c.user_delete("bob").await.unwrap();
    assert_status(c.user_delete("bob").await, Code::FailedPrecondition, USER_NOT_FOUND);
    assert_status(c.user_get("bob").await, Code::FailedPrecondition, USER_NOT_FOUND);
    assert_eq!(
        c.user_list().await.unwrap().users(),
        strings(&["alice", "nopw", "root"])
    );
    // With auth disabled, root's role can still be taken away, and root deleted.
    c.user_revoke_role("root", "root").await.unwrap();
    c.user_delete("root").await.unwrap();
    c.role_delete("root").await.unwrap();
    assert_eq!(c.user_list().await.unwrap().users(), strings(&["alice", "nopw"]));
    assert_eq!(c.role_list().await.unwrap().roles(), strings(&["app"]));
}

#[tokio::test]
async fn enabling_auth_needs_root_with_the_root_role_then_tokens_are_required() {
    let (member, mut c) = start("auth-enable", &[]).await;

    // Authenticating before auth is enabled is refused, so is connecting with a user.
    c.user_add("alice", "alice-pw", None).await.unwrap();
    assert_status(
        c.auth_client().authenticate("alice".into(), "alice-pw".into()).await,
        Code::FailedPrecondition,
        NOT_ENABLED,
    );
    assert_status(
        connect_as(&member, "alice", "alice-pw").await.map(drop),
        Code::FailedPrecondition,
        NOT_ENABLED,
    );

    // Enabling needs a root user, with the root role.
    assert_status(
        c.auth_enable().await,
        Code::FailedPrecondition,
        "etcdserver: root user does not exist",
    );
    c.user_add("root", ROOT_PW, None).await.unwrap();
    assert_status(
        c.auth_enable().await,
        Code::FailedPrecondition,
        "etcdserver: root user does not have root role",
    );
    c.role_add("root").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.user_add("nopw", "", Some(UserAddOptions::new().with_no_pwd()))
        .await
        .unwrap();
    c.put("before", "auth", None).await.unwrap();
    c.auth_enable().await.unwrap();

    // The client without a token: every KV call and admin call is refused as anonymous.
    assert_status(c.get("before", None).await, Code::InvalidArgument, USER_EMPTY);
    assert_status(c.put("k", "v", None).await, Code::InvalidArgument, USER_EMPTY);
    assert_status(c.delete("before", None).await, Code::InvalidArgument, USER_EMPTY);
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::get("before", None)])).await,
        Code::InvalidArgument,
        USER_EMPTY,
    );
    assert_status(c.user_list().await, Code::InvalidArgument, USER_EMPTY);
    assert_status(c.auth_disable().await, Code::InvalidArgument, USER_EMPTY);

    // Authenticate: right password gives a token, a new one each time; wrong passwords and
    // unknown users are refused alike; a no-password user cannot authenticate.
    let mut auth = c.auth_client();
    let t1 = auth.authenticate("root".into(), ROOT_PW.into()).await.unwrap();
    let t2 = auth.authenticate("root".into(), ROOT_PW.into()).await.unwrap();
    assert!(!t1.token().is_empty());
    assert_ne!(t1.token(), t2.token());
    assert_status(
        auth.authenticate("root".into(), "wrong".into()).await,
        Code::InvalidArgument,
        AUTH_FAILED,
    );
    assert_status(
        auth.authenticate("nobody".into(), ROOT_PW.into()).await,
        Code::InvalidArgument,
        AUTH_FAILED,
    );
    assert_status(
        connect_as(&member, "root", "wrong").await.map(drop),
        Code::InvalidArgument,
        AUTH_FAILED,
    );
    assert_status(
        connect_as(&member, "nobody", "pw").await.map(drop),
        Code::InvalidArgument,
        AUTH_FAILED,
    );
    // etcd's error for it is not mapped to a gRPC code: Unknown with the auth store's text.
    assert_status(
        connect_as(&member, "nopw", "any").await.map(drop),
        Code::Unknown,
        "auth: authentication failed, password was given for no password user",
    );

    // Root, connected with its user, does everything.
    let mut root = connect_as(&member, "root", ROOT_PW).await.unwrap();
    assert_eq!(value(&mut root, "before").await.as_deref(), Some("auth"));
    root.put("k", "v", None).await.unwrap();
    assert_eq!(value(&mut root, "k").await.as_deref(), Some("v"));
    assert_eq!(
        root.user_list().await.unwrap().users(),
        strings(&["alice", "nopw", "root"])
    );
    assert_eq!(root.member_list().await.unwrap().members().len(), 1);
    // Enabling again is a no-op.
    root.auth_enable().await.unwrap();

    // A user without the root role: no admin calls, no keys.
    let mut alice = connect_as(&member, "alice", "alice-pw").await.unwrap();
    assert_status(alice.user_list().await, Code::PermissionDenied, PERMISSION_DENIED);
    assert_status(alice.role_add("r").await, Code::PermissionDenied, PERMISSION_DENIED);
    assert_status(alice.auth_disable().await, Code::PermissionDenied, PERMISSION_DENIED);
    assert_status(alice.get("k", None).await, Code::PermissionDenied, PERMISSION_DENIED);
    assert_status(
        alice.put("k", "x", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );

    // While auth is on, root cannot be removed nor lose its role.
    assert_status(root.user_delete("root").await, Code::InvalidArgument, INVALID_MGMT);
    assert_status(
        root.user_revoke_role("root", "root").await,
        Code::InvalidArgument,
        INVALID_MGMT,
    );
    assert_status(root.role_delete("root").await, Code::InvalidArgument, INVALID_MGMT);
    assert_eq!(root.user_get("root").await.unwrap().roles(), strings(&["root"]));

    // Disabling: only root's client could; then anyone can again, tokens are ignored, and
    // authenticating is refused.
    root.auth_disable().await.unwrap();
    assert_eq!(value(&mut c, "k").await.as_deref(), Some("v"));
    c.put("k", "anon", None).await.unwrap();
    assert_eq!(value(&mut alice, "k").await.as_deref(), Some("anon"));
    root.put("k", "root", None).await.unwrap();
    assert_eq!(
        c.user_list().await.unwrap().users(),
        strings(&["alice", "nopw", "root"])
    );
    assert_status(
        connect_as(&member, "root", ROOT_PW).await.map(drop),
        Code::FailedPrecondition,
        NOT_ENABLED,
    );
    // Disabling twice is a no-op.
    c.auth_disable().await.unwrap();

    // Enabling again: the tokens handed out before are gone; the crate gets a new one.
    c.auth_enable().await.unwrap();
    assert_status(root.get("k", None).await, Code::Unauthenticated, INVALID_TOKEN);
    root.refresh_token().await.unwrap();
    assert_eq!(value(&mut root, "k").await.as_deref(), Some("root"));
    assert_status(c.get("k", None).await, Code::InvalidArgument, USER_EMPTY);
    root.auth_disable().await.unwrap();
}

#[tokio::test]
async fn a_user_limited_to_a_prefix() {
    let (member, mut c) = start("auth-prefix", &[]).await;
    c.role_add("app").await.unwrap();
    c.role_grant_permission("app", Permission::read_write("app/").with_prefix())
        .await
        .unwrap();
    c.role_add("reader").await.unwrap();
    c.role_grant_permission("reader", Permission::read("pub/").with_prefix())
        .await
        .unwrap();
    c.user_add("alice", "alice-pw", None).await.unwrap();
    c.user_grant_role("alice", "app").await.unwrap();
    c.user_grant_role("alice", "reader").await.unwrap();
    let mut root = enable_with_root(&member, &mut c).await;
    root.put("app/seed", "s", None).await.unwrap();
    root.put("pub/news", "n", None).await.unwrap();
    root.put("secret", "x", None).await.unwrap();
    root.put("apq", "next to app/", None).await.unwrap();

    let mut alice = connect_as(&member, "alice", "alice-pw").await.unwrap();

    // Inside the prefix: read and write.
    alice.put("app/a", "1", None).await.unwrap();
    assert_eq!(value(&mut alice, "app/a").await.as_deref(), Some("1"));
    let r = alice.get("app/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(keys(&r), strings(&["app/a", "app/seed"]));
    let r = alice
        .get("app/a", Some(GetOptions::new().with_range("app/z")))
        .await
        .unwrap();
    assert_eq!(keys(&r), strings(&["app/a", "app/seed"]));
    let r = alice.delete("app/a", None).await.unwrap();
    assert_eq!(r.deleted(), 1);
    // The read-only prefix.
    assert_eq!(value(&mut alice, "pub/news").await.as_deref(), Some("n"));
    assert_status(
        alice.put("pub/x", "1", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_status(
        alice.delete("pub/news", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );

    // Outside: denied, for single keys and for ranges reaching past the prefix.
    assert_status(
        alice.get("secret", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_status(
        alice.put("secret", "y", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_status(
        alice.delete("secret", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_status(
        alice.get("app", Some(GetOptions::new().with_prefix())).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_status(
        alice.get("", Some(GetOptions::new().with_all_keys())).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_status(
        alice.delete("app/", Some(DeleteOptions::new().with_range("apr"))).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    // A txn is denied as a whole if any of its ops is outside, and writes nothing.
    assert_status(
        alice
            .txn(Txn::new().and_then([TxnOp::put("app/t", "t", None), TxnOp::get("secret", None)]))
            .await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_eq!(value(&mut root, "app/t").await, None);
    let r = alice
        .txn(Txn::new().and_then([TxnOp::put("app/t", "t", None), TxnOp::get("pub/news", None)]))
        .await
        .unwrap();
    assert!(r.succeeded());
    match &r.op_responses()[1] {
        TxnOpResponse::Get(g) => assert_eq!(keys(g), strings(&["pub/news"])),
        other => panic!("expected a get response, got {other:?}"),
    }
    assert_eq!(value(&mut root, "app/t").await.as_deref(), Some("t"));
    // Nothing outside changed.
    assert_eq!(value(&mut root, "secret").await.as_deref(), Some("x"));
    assert_eq!(value(&mut root, "pub/news").await.as_deref(), Some("n"));

    // Watch: inside the prefix it works; outside it is refused with the invalid watch ID and
    // the gRPC error's text.
    let mut w = alice
        .watch("app/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let created = next_message(&mut w).await;
    assert!(created.created() && !created.canceled(), "{created:?}");
    let id = created.watch_id();
    root.put("app/w", "w", None).await.unwrap();
    let ev = next_message(&mut w).await;
    assert_eq!(ev.watch_id(), id);
    let got: Vec<(String, String)> = ev
        .events()
        .iter()
        .map(|e| {
            let kv = e.kv().unwrap();
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect();
    assert_eq!(got, vec![("app/w".to_string(), "w".to_string())]);
    let mut denied = alice.watch("secret", None).await.unwrap();
    let refused = next_message(&mut denied).await;
    assert_eq!(
        (
            refused.watch_id(),
            refused.created(),
            refused.canceled(),
            refused.cancel_reason()
        ),
        (
            -1,
            true,
            true,
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
        ),
        "{refused:?}"
    );

    // Permissions follow role changes at once, on the same token.
    root.user_revoke_role("alice", "app").await.unwrap();
    assert_status(
        alice.get("app/seed", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    assert_eq!(value(&mut alice, "pub/news").await.as_deref(), Some("n"));
    root.role_revoke_permission("reader", "pub/", Some(RoleRevokePermissionOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_status(
        alice.get("pub/news", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    root.user_grant_role("alice", "app").await.unwrap();
    assert_eq!(value(&mut alice, "app/seed").await.as_deref(), Some("s"));
    // A permission from a second role widens the first.
    root.role_grant_permission("reader", Permission::read("secret"))
        .await
        .unwrap();
    assert_eq!(value(&mut alice, "secret").await.as_deref(), Some("x"));
    assert_status(
        alice.put("secret", "y", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
}

#[tokio::test]
async fn a_changed_password_or_a_deleted_user_refuses_the_old_token() {
    let (member, mut c) = start("auth-password", &[]).await;
    c.role_add("app").await.unwrap();
    c.role_grant_permission("app", Permission::read_write("app/").with_prefix())
        .await
        .unwrap();
    c.user_add("alice", "pw-1", None).await.unwrap();
    c.user_grant_role("alice", "app").await.unwrap();
    let mut root = enable_with_root(&member, &mut c).await;

    let mut alice = connect_as(&member, "alice", "pw-1").await.unwrap();
    alice.put("app/k", "1", None).await.unwrap();

    // The password changes: alice's token is refused; the crate's refresh with the old
    // password fails; connecting needs the new password.
    root.user_change_password("alice", "pw-2").await.unwrap();
    assert_status(alice.get("app/k", None).await, Code::Unauthenticated, INVALID_TOKEN);
    assert_status(
        alice.put("app/k", "2", None).await,
        Code::Unauthenticated,
        INVALID_TOKEN,
    );
    assert_status(alice.refresh_token().await, Code::InvalidArgument, AUTH_FAILED);
    assert_status(
        connect_as(&member, "alice", "pw-1").await.map(drop),
        Code::InvalidArgument,
        AUTH_FAILED,
    );
    let mut again = connect_as(&member, "alice", "pw-2").await.unwrap();
    assert_eq!(value(&mut again, "app/k").await.as_deref(), Some("1"));
    // The old client re-authenticates with the new password.
    alice
        .update_user(Some(("alice".to_string(), "pw-2".to_string())))
        .await
        .unwrap();
    alice.put("app/k", "2", None).await.unwrap();
    assert_eq!(value(&mut again, "app/k").await.as_deref(), Some("2"));
    // Root's own token is unaffected by alice's change.
    assert_eq!(value(&mut root, "app/k").await.as_deref(), Some("2"));

    // With automatic refresh, the refused token leads to authenticating again with the
    // client's password, which is refused after a change: the call fails with that error.
    let auto = ConnectOptions::new()
        .with_user("alice", "pw-2")
        .with_auto_token_refresh(true);
    let mut auto = member.connect(Some(auto)).await.unwrap();
    auto.get("app/k", None).await.unwrap();
    root.user_change_password("alice", "pw-3").await.unwrap();
    assert_status(auto.get("app/k", None).await, Code::InvalidArgument, AUTH_FAILED);
    // Given the new password, it carries on.
    auto.update_user(Some(("alice".to_string(), "pw-3".to_string())))
        .await
        .unwrap();
    assert_eq!(value(&mut auto, "app/k").await.as_deref(), Some("2"));

    // Deleting the user: its live tokens are refused, and it cannot authenticate.
    let mut plain = connect_as(&member, "alice", "pw-3").await.unwrap();
    assert_eq!(value(&mut plain, "app/k").await.as_deref(), Some("2"));
    root.user_delete("alice").await.unwrap();
    assert_status(plain.get("app/k", None).await, Code::Unauthenticated, INVALID_TOKEN);
    assert_status(auto.get("app/k", None).await, Code::InvalidArgument, AUTH_FAILED);
    assert_status(
        connect_as(&member, "alice", "pw-3").await.map(drop),
        Code::InvalidArgument,
        AUTH_FAILED,
    );
    // Re-created with the same name, the old tokens stay dead.
    root.user_add("alice", "pw-4", None).await.unwrap();
    root.user_grant_role("alice", "app").await.unwrap();
    assert_status(plain.get("app/k", None).await, Code::Unauthenticated, INVALID_TOKEN);
    let mut fresh = connect_as(&member, "alice", "pw-4").await.unwrap();
    assert_eq!(value(&mut fresh, "app/k").await.as_deref(), Some("2"));
}

/// The number of Authenticate calls the member has started, from its `/metrics`
/// (go-grpc-prometheus's `grpc_server_started_total`, which etcd has for every gRPC method).
fn authenticate_count(member: &Member) -> u64 {
    let addr = member.client_url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body.lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(r#"grpc_method="Authenticate""#))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The simple tokens' TTL the member of the expiry test runs with, in seconds: long beside the
/// half-second between uses below, so a loaded machine's stalls cannot expire a token in use.
/// (Sliding and expiry on exact clocks are the engine's unit tests, `auth::tokens`.)
const TTL_SECS: u64 = 4;

/// Waits long enough, unused, for a token to expire.
async fn outlive_tokens() {
    tokio::time::sleep(Duration::from_millis(TTL_SECS * 1000 + 1500)).await;
}

#[tokio::test]
async fn expired_tokens_and_the_crates_refresh() {
    let ttl = TTL_SECS.to_string();
    let (member, mut c) = start("auth-ttl", &["--auth-token-ttl", &ttl]).await;
    let mut root = enable_with_root(&member, &mut c).await;
    root.put("k", "v", None).await.unwrap();

    // A token in use does not expire: each use slides its expiry, so it outlives its TTL.
    let until = Instant::now() + Duration::from_secs(2 * TTL_SECS);
    while Instant::now() < until {
        assert_eq!(value(&mut root, "k").await.as_deref(), Some("v"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Unused for longer than the TTL, it does: without automatic refresh, the client keeps
    // failing until it refreshes its token; with it, the crate re-authenticates and retries.
    let auto_options = ConnectOptions::new()
        .with_user("root", ROOT_PW)
        .with_auto_token_refresh(true);
    let mut auto = member.connect(Some(auto_options)).await.unwrap();
    assert_eq!(value(&mut auto, "k").await.as_deref(), Some("v"));
    outlive_tokens().await;
    assert_status(root.get("k", None).await, Code::Unauthenticated, INVALID_TOKEN);
    assert_status(root.put("k", "w", None).await, Code::Unauthenticated, INVALID_TOKEN);
    assert_status(root.user_list().await, Code::Unauthenticated, INVALID_TOKEN);
    assert_eq!(value(&mut auto, "k").await.as_deref(), Some("v"));
    auto.put("k", "w", None).await.unwrap();
    root.refresh_token().await.unwrap();
    assert_eq!(value(&mut root, "k").await.as_deref(), Some("w"));

    // Auth management calls are refreshed too.
    outlive_tokens().await;
    assert_eq!(auto.user_list().await.unwrap().users(), strings(&["root"]));
    outlive_tokens().await;
    assert_eq!(
        auto.auth_client().role_list().await.unwrap().roles(),
        strings(&["root"])
    );

    auto.auth_disable().await.unwrap();
    // Auth off: no token is needed, an expired one is ignored.
    outlive_tokens().await;
    assert_eq!(value(&mut c, "k").await.as_deref(), Some("w"));
    assert_eq!(value(&mut root, "k").await.as_deref(), Some("w"));
}

/// As the crate's own test of it: calls which all find the token expired authenticate once
/// between them (the crate serializes the refresh and retries each call with the new token),
/// counted on the member's `/metrics`.
#[tokio::test]
async fn concurrent_calls_with_an_expired_token_authenticate_once() {
    let ttl = TTL_SECS.to_string();
    let (member, mut c) = start("auth-ttl-concurrent", &["--auth-token-ttl", &ttl]).await;
    enable_with_root(&member, &mut c).await;
    let options = ConnectOptions::new()
        .with_user("root", ROOT_PW)
        .with_auto_token_refresh(true);
    let auto = member.connect(Some(options)).await.unwrap();
    outlive_tokens().await;

    let before = authenticate_count(&member);
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let mut client = auto.clone();
            tokio::spawn(async move { client.put(format!("c/{i}"), "x", None).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let r = auto
        .clone()
        .get("c/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(r.count(), 16);
    assert_eq!(
        authenticate_count(&member),
        before + 1,
        "Authenticate calls counted by grpc_server_started_total{{grpc_method=\"Authenticate\"}} \
         (etcd counts every method of its gRPC services)"
    );
}
