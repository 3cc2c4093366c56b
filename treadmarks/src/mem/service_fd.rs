//! The doorbell's service eventfd, registered with the service thread's tokio reactor.

use super::doorbell::Doorbell;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Owns a reference to the [`Doorbell`], and so keeps its service eventfd open.
#[derive(Debug)]
pub struct ServiceFd(Arc<Doorbell>);

impl AsRawFd for ServiceFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.service_fd()
    }
}

/// Registers the doorbell's service eventfd for readability with the current tokio runtime.
pub fn register_service_fd(doorbell: Arc<Doorbell>) -> std::io::Result<AsyncFd<ServiceFd>> {
    // SAFETY: the eventfd belongs to the `Doorbell`, which closes it only on drop; `ServiceFd`
    // holds an `Arc` to it, so the fd stays open and unchanged for the whole life of the
    // `AsyncFd`, and `as_raw_fd` always returns that same fd.
    unsafe { AsyncFd::register_with_interest(ServiceFd(doorbell), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
