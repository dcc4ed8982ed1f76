//! Simple tokens (etcd's `--auth-token=simple`): opaque strings naming a user, registered on
//! every member when their `Authenticate` entry is applied, valid while used at least once per
//! TTL (each use slides the expiry), and gone when their user is deleted or changes password.
//! They live in memory only: a restarted member knows none, and clients authenticate again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

/// The tokens this member knows.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    clock: Arc<dyn Clock>,
    /// Token → (user, expiry on `clock`).
    live: HashMap<String, (String, Duration)>,
}

impl SimpleTokens {
    /// Tokens that live `ttl` unused, on `clock`.
    pub fn new(ttl: Duration, clock: Arc<dyn Clock>) -> SimpleTokens {
        SimpleTokens {
            ttl,
            clock,
            live: HashMap::new(),
        }
    }

    /// Registers `token` for `user`.
    pub fn register(&mut self, token: String, user: String) {
        let now = self.clock.now();
        // Expired tokens go whenever one is added, so they cannot pile up.
        self.live.retain(|_, (_, expiry)| *expiry > now);
        self.live.insert(token, (user, now + self.ttl));
    }

    /// The user `token` names, if it is live; its expiry slides.
    pub fn resolve(&mut self, token: &str) -> Option<String> {
        let now = self.clock.now();
        let (user, expiry) = self.live.get_mut(token)?;
        if *expiry <= now {
            self.live.remove(token);
            return None;
        }
        *expiry = now + self.ttl;
        Some(user.clone())
    }

    /// Forgets every token of `user`.
    pub fn invalidate_user(&mut self, user: &str) {
        self.live.retain(|_, (u, _)| u != user);
    }

    /// Forgets every token (auth disabled).
    pub fn clear(&mut self) {
        self.live.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn tokens_slide_expire_and_die_with_their_user() {
        let clock = Arc::new(ManualClock::default());
        let mut t = SimpleTokens::new(Duration::from_secs(300), clock.clone());
        t.register("a.1".into(), "alice".into());
        t.register("b.2".into(), "bob".into());
        clock.advance(Duration::from_secs(200));
        assert_eq!(t.resolve("a.1").as_deref(), Some("alice"));
        clock.advance(Duration::from_secs(200));
        assert_eq!(t.resolve("a.1").as_deref(), Some("alice"), "the use at 200 s slid it");
        assert_eq!(t.resolve("b.2"), None, "unused for 400 s");
        t.invalidate_user("alice");
        assert_eq!(t.resolve("a.1"), None);
    }
}
