//! Connecting to the owner's control plane, with its bearer token when
//! the owner asks for one ([`crate::auth`]).

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::auth::BearerAuth;
use crate::control::weight_owner_client::WeightOwnerClient;

/// A control-plane client that sends the token (if any) with every call.
pub type ControlClient = WeightOwnerClient<InterceptedService<Channel, BearerAuth>>;

/// Where the control plane listens: `unix:/path/to.sock` or `host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAddr {
    Unix(PathBuf),
    Tcp(String),
}

impl ControlAddr {
    pub fn parse(s: &str) -> ControlAddr {
        match s.strip_prefix("unix:") {
            Some(p) => ControlAddr::Unix(PathBuf::from(p)),
            None => ControlAddr::Tcp(s.trim_start_matches("http://").to_string()),
        }
    }
}

impl std::fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ControlAddr::Tcp(a) => f.write_str(a),
        }
    }
}

/// A control-plane client over a Unix socket or TCP; `auth` adds the
/// owner's token to every call.
pub async fn connect(
    addr: &ControlAddr,
    auth: BearerAuth,
) -> Result<ControlClient, tonic::transport::Error> {
    let channel = match addr {
        ControlAddr::Tcp(a) => Endpoint::try_from(format!("http://{a}"))?.connect().await?,
        ControlAddr::Unix(path) => {
            let path = path.clone();
            // The URI is required by the API and ignored by the connector.
            Endpoint::try_from("http://[::1]:50051")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let s = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(s))
                    }
                }))
                .await?
        }
    };
    Ok(WeightOwnerClient::with_interceptor(channel, auth))
}
