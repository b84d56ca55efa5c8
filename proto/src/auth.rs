//! The control plane's shared secret, for an owner on TCP: the token file
//! the owner and its clients read (`--grpc-token-file`), the bearer token
//! clients send in the `authorization` metadata of every call
//! ([`BearerAuth`]), and the owner's check of it ([`Token::check`],
//! constant time). A Unix-socket control plane needs no token: its peers
//! are checked by their SO_PEERCRED credentials.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The shortest token accepted, in bytes.
pub const MIN_TOKEN_BYTES: usize = 16;
/// How to make a token file, for error messages and docs.
pub const MAKE_TOKEN: &str = "make one with: (umask 077; head -c 32 /dev/urandom | base64 > FILE)";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file {path} can be read by every user (mode {mode:o}); chmod o-rwx it")]
    WorldReadable { path: PathBuf, mode: u32 },
    #[error("token file {path}: the token is {len} bytes, at least {MIN_TOKEN_BYTES} are needed; {MAKE_TOKEN}")]
    TooShort { path: PathBuf, len: usize },
    #[error("token file {path}: the token must be one line of printable ASCII without spaces; {MAKE_TOKEN}")]
    NotPrintable { path: PathBuf },
}

/// A shared secret read from a token file (surrounding whitespace and
/// the final newline are not part of it). Its `Debug` does not show it.
#[derive(Clone)]
pub struct Token {
    secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Read and check a token file: a regular file, not readable by every
    /// user, holding one token of at least [`MIN_TOKEN_BYTES`] printable
    /// ASCII bytes.
    pub fn read_file(path: &Path) -> Result<Token, TokenError> {
        use std::os::unix::fs::PermissionsExt;
        let read = |source| TokenError::Read {
            path: path.into(),
            source,
        };
        let file = ds4_model::gguf::open_regular(path).map_err(read)?;
        let mode = file.metadata().map_err(read)?.permissions().mode() & 0o777;
        if mode & 0o007 != 0 {
            return Err(TokenError::WorldReadable {
                path: path.into(),
                mode,
            });
        }
        let mut text = String::new();
        file.take(4096)
            .read_to_string(&mut text)
            .map_err(|_| TokenError::NotPrintable { path: path.into() })?;
        let secret = text.trim();
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable { path: path.into() });
        }
        if secret.len() < MIN_TOKEN_BYTES {
            return Err(TokenError::TooShort {
                path: path.into(),
                len: secret.len(),
            });
        }
        Ok(Token {
            secret: secret.to_string(),
        })
    }

    /// The `authorization` metadata value clients send.
    fn bearer(&self) -> MetadataValue<Ascii> {
        format!("Bearer {}", self.secret)
            .parse()
            .expect("printable ASCII is a valid metadata value")
    }

    /// The owner's check of a call's metadata: `UNAUTHENTICATED` without a
    /// bearer token or with another one. The comparison takes the same
    /// time wherever the tokens differ.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let sent = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let Some(sent) = sent else {
            return Err(Status::unauthenticated(
                "this control plane needs a token: pass --grpc-token-file (or DS4_WEIGHT_GRPC_TOKEN_FILE) with the owner's token file",
            ));
        };
        if !constant_time_eq(sent.as_bytes(), self.secret.as_bytes()) {
            return Err(Status::unauthenticated(
                "wrong token: pass the owner's --grpc-token-file",
            ));
        }
        Ok(())
    }
}

/// Equal digests of both; the time does not depend on where they differ
/// (nor on the lengths, which are hashed away).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (da, db) = (Sha256::digest(a), Sha256::digest(b));
    let diff = da
        .iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// The client side: adds the bearer token, when there is one, to every
/// call.
#[derive(Clone, Debug, Default)]
pub struct BearerAuth {
    value: Option<MetadataValue<Ascii>>,
}

impl BearerAuth {
    /// Send `token` with every call (`None`: send nothing).
    pub fn new(token: Option<&Token>) -> BearerAuth {
        BearerAuth {
            value: token.map(Token::bearer),
        }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(format!("token-{mode:o}-{}", text.len()));
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn reads_checks_and_compares() {
        let dir = tempfile::tempdir().unwrap();
        let good = "c2VjcmV0LXRva2VuLW9mLTMyLWJ5dGVzLi4uLg==";
        let t = Token::read_file(&token_file(dir.path(), &format!("{good}\n"), 0o600)).unwrap();
        assert_eq!(format!("{t:?}"), "Token(..)");

        let mut md = MetadataMap::new();
        let e = t.check(&md).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        md.insert(
            "authorization",
            "Bearer nope-nope-nope-nope".parse().unwrap(),
        );
        assert!(t.check(&md).unwrap_err().message().contains("wrong token"));
        let req = BearerAuth::new(Some(&t)).call(Request::new(())).unwrap();
        assert!(t.check(req.metadata()).is_ok());
        let req = BearerAuth::new(None).call(Request::new(())).unwrap();
        assert!(req.metadata().get("authorization").is_none());

        let e = Token::read_file(&token_file(dir.path(), good, 0o644)).unwrap_err();
        assert!(e.to_string().contains("every user"), "{e}");
        let e = Token::read_file(&token_file(dir.path(), "short", 0o600)).unwrap_err();
        assert!(e.to_string().contains("at least 16"), "{e}");
        let e = Token::read_file(&token_file(dir.path(), "two words of a token", 0o600));
        assert!(matches!(e, Err(TokenError::NotPrintable { .. })), "{e:?}");
        let e = Token::read_file(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
