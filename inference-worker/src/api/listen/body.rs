//! The bodies that carry a request's life on its connection: a request
//! body that must arrive within the body timeout ([`TimedBody`], failing
//! with [`BodyTimeout`]), and a response body that holds the request's
//! [`InFlight`] mark until it is written out or dropped ([`Tracked`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::conn::{BodyWatch, InFlight};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The declared request body did not arrive within the body timeout.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the request body did not arrive within {secs} s")]
pub struct BodyTimeout {
    pub secs: u64,
}

impl BodyTimeout {
    /// The timeout somewhere in `e`'s chain of sources, if any.
    pub fn find(e: &(dyn std::error::Error + 'static)) -> Option<BodyTimeout> {
        let mut cur = Some(e);
        while let Some(e) = cur {
            if let Some(t) = e.downcast_ref::<BodyTimeout>() {
                return Some(*t);
            }
            cur = e.source();
        }
        None
    }
}

/// A request body that fails with [`BodyTimeout`] unless it has ended
/// within `timeout` of the request head; its end is reported to `watch`.
pub struct TimedBody<B> {
    inner: B,
    /// Running until the body ends.
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    watch: Arc<BodyWatch>,
}

impl<B: Body + Unpin> TimedBody<B> {
    pub fn new(inner: B, timeout: Duration, watch: Arc<BodyWatch>) -> TimedBody<B> {
        TimedBody {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            timeout,
            watch,
        }
    }

    fn ended(&mut self) {
        self.deadline = None;
        self.watch.done();
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(deadline) = this.deadline.as_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into);
        };
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.ended();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.inner.is_end_stream() {
                    this.ended();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Pending => {
                ready!(deadline.as_mut().poll(cx));
                this.deadline = None;
                let secs = this.timeout.as_secs().max(1);
                Poll::Ready(Some(Err(Box::new(BodyTimeout { secs }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body holding its request's [`InFlight`] mark: the request
/// counts as in flight until the body is written out or dropped.
pub struct Tracked<B> {
    inner: B,
    _flight: Option<InFlight>,
}

impl<B> Tracked<B> {
    pub fn new(inner: B, flight: Option<InFlight>) -> Tracked<B> {
        Tracked {
            inner,
            _flight: flight,
        }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::listen::conn::Conn;
    use crate::api::ApiError;
    use axum::extract::{FromRequest, Request};
    use axum::http::StatusCode;

    /// A body whose bytes never come.
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_stalled_body_is_refused_with_a_timeout() {
        let conn = Conn::new(0);
        let (_flight, watch) = conn.begin(true).unwrap();
        let body = TimedBody::new(Stalled, Duration::from_millis(20), watch);
        let req = Request::new(axum::body::Body::new(body));
        let r = Bytes::from_request(req, &()).await.unwrap_err();
        let e = ApiError::from_rejection(r, 1024);
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT, "{e}");
        assert!(
            conn.try_evict(),
            "a stalled body leaves the connection evictable"
        );
    }

    #[tokio::test]
    async fn a_body_that_arrives_marks_its_request_answering() {
        let conn = Conn::new(0);
        let (_flight, watch) = conn.begin(true).unwrap();
        let inner = axum::body::Body::from("{}");
        let body = TimedBody::new(inner, Duration::from_secs(60), watch);
        let req = Request::new(axum::body::Body::new(body));
        assert_eq!(&Bytes::from_request(req, &()).await.unwrap()[..], b"{}");
        assert!(!conn.try_evict(), "its answer is being made");
    }
}
