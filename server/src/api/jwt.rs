//! JWT tokens (`--auth-token jwt,pub-key=…,priv-key=…,sign-method=…,ttl=…`), as etcd issues
//! them: claims `username`, `revision` (the auth store's, when issued) and `exp`, signed with
//! the member's key; any member holding the public key verifies them, so they need no log
//! entry. A token whose revision is behind the auth store's is refused with etcd's "revision of
//! auth store is old" by the permission checks.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// etcd's default token lifetime.
const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// A member's JWT keys and settings.
#[derive(Clone)]
pub struct Jwt {
    algorithm: Algorithm,
    /// `None`: verify only (a public key without its private key).
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
    ttl: Duration,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("algorithm", &self.algorithm)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

fn read(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{path}: {e}"))
}

impl Jwt {
    /// Parses `--auth-token`'s options after `jwt,` (etcd's names; unknown ones are ignored
    /// with a warning, as etcd does).
    pub fn from_options(options: &str) -> Result<Jwt, String> {
        let mut method = None;
        let (mut public, mut private, mut ttl) = (None, None, DEFAULT_TTL);
        for option in options.split(',').filter(|o| !o.is_empty()) {
            let (name, value) = option.split_once('=').unwrap_or((option, ""));
            match name {
                "sign-method" => method = Some(value.to_string()),
                "pub-key" => public = Some(read(value)?),
                "priv-key" => private = Some(read(value)?),
                "ttl" => {
                    ttl = crate::config::go_duration("auth-token", value).map_err(|e| e.to_string())?;
                }
                other => tracing::warn!(option = other, "unknown JWT option; ignored"),
            }
        }
        let method = method.ok_or("sign-method is required")?;
        let algorithm: Algorithm = method.parse().map_err(|_| format!("unknown sign-method {method:?}"))?;
        let bad = |what: &str, e: jsonwebtoken::errors::Error| format!("{what}: {e}");
        let (signing, verifying) = match algorithm {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                let secret = private.ok_or("priv-key is required for HMAC methods")?;
                (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                )
            }
            _ => {
                let public = public.ok_or("pub-key is required (cairn verifies with it)")?;
                let (signing, verifying) = match algorithm {
                    Algorithm::ES256 | Algorithm::ES384 => (
                        private.map(|p| EncodingKey::from_ec_pem(&p)).transpose(),
                        DecodingKey::from_ec_pem(&public),
                    ),
                    Algorithm::EdDSA => (
                        private.map(|p| EncodingKey::from_ed_pem(&p)).transpose(),
                        DecodingKey::from_ed_pem(&public),
                    ),
                    _ => (
                        private.map(|p| EncodingKey::from_rsa_pem(&p)).transpose(),
                        DecodingKey::from_rsa_pem(&public),
                    ),
                };
                (
                    signing.map_err(|e| bad("priv-key", e))?,
                    verifying.map_err(|e| bad("pub-key", e))?,
                )
            }
        };
        let jwt = Jwt {
            algorithm,
            signing,
            verifying,
            ttl,
        };
        // A key pair that does not match would issue tokens no member accepts.
        if jwt.signing.is_some() {
            let token = jwt.sign("check", 1)?;
            if jwt.verify(&token).is_none() {
                return Err("pub-key does not match priv-key".into());
            }
        }
        Ok(jwt)
    }

    /// A token for `user` at auth revision `revision`.
    pub fn sign(&self, user: &str, revision: u64) -> Result<String, String> {
        let Some(key) = &self.signing else {
            return Err("auth: this member can only verify JWT tokens (no priv-key)".into());
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let claims = Claims {
            username: user.to_string(),
            revision,
            exp: (now + self.ttl).as_secs(),
        };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key).map_err(|e| e.to_string())
    }

    /// The user and revision a valid, unexpired token names.
    pub fn verify(&self, token: &str) -> Option<(String, u64)> {
        let mut validation = Validation::new(self.algorithm);
        validation.leeway = 0;
        validation.required_spec_claims = ["exp".to_string()].into_iter().collect();
        let data = jsonwebtoken::decode::<Claims>(token, &self.verifying, &validation).ok()?;
        Some((data.claims.username, data.claims.revision))
    }
}
