//! The dashboard's source on a mesh node: its questions asked through the node's loop as control requests, like the control socket's.

use std::collections::HashMap;

use tokio::sync::mpsc;

use super::reply::Reply;
use super::LoopHandle;
use crate::control::{ControlRequest, ControlResponse};
use crate::dash::{self, SourceError};
use crate::view::{FarmView, Observed};

/// The dashboard's view of a mesh node: the control requests, asked
/// through the node's loop like the control socket's.
pub(super) struct MeshSource {
    pub(super) handle: LoopHandle,
}

impl MeshSource {
    fn ask(
        &self,
        req: ControlRequest,
    ) -> impl std::future::Future<Output = mpsc::Receiver<ControlResponse>> + Send + 'static {
        let handle = self.handle.clone();
        async move { ask_node(&handle, req).await }
    }
}

/// A control request to the node's loop, as the control socket sends them.
async fn ask_node(handle: &LoopHandle, req: ControlRequest) -> mpsc::Receiver<ControlResponse> {
    match handle.control(req).await {
        Ok(rx) => rx,
        // The loop is gone: an answer that ends at once, as a dropped reply's.
        Err(_) => Reply::channel().1,
    }
}

impl dash::Source for MeshSource {
    fn observe(
        &self,
        since: HashMap<String, u64>,
    ) -> dash::BoxFuture<Result<Observed, SourceError>> {
        let rx = self.ask(ControlRequest::Observe { since });
        Box::pin(async move {
            let mut rx = rx.await;
            match rx.recv().await {
                Some(ControlResponse::Observed(o)) => Ok(*o),
                Some(ControlResponse::Error { message, .. }) => Err(SourceError::Refused(message)),
                _ => Err(SourceError::Stopping),
            }
        })
    }

    fn farms(&self) -> dash::BoxFuture<Result<Vec<FarmView>, SourceError>> {
        let list = self.ask(ControlRequest::List);
        let handle = self.handle.clone();
        Box::pin(async move {
            let mut list = list.await;
            let mut all = match list.recv().await {
                Some(ControlResponse::List(v)) => v,
                Some(ControlResponse::Error { message, .. }) => {
                    return Err(SourceError::Refused(message))
                }
                _ => return Err(SourceError::Stopping),
            };
            // The running first, then the newest kept of the rest.
            all.sort_by_key(|f| f.finished);
            all.truncate(dash::view::FARMS_MAX);
            let mut views = Vec::with_capacity(all.len());
            for short in all {
                let mut rx = ask_node(
                    &handle,
                    ControlRequest::Farm {
                        farm: short.id.clone(),
                    },
                )
                .await;
                match rx.recv().await {
                    Some(ControlResponse::Farm(v)) => views.push(*v),
                    _ => views.push(short),
                }
            }
            Ok(views)
        })
    }

    fn logs(
        &self,
        farm: String,
        task: String,
        attempt: Option<u32>,
    ) -> dash::BoxFuture<Result<String, SourceError>> {
        let rx = self.ask(ControlRequest::Logs {
            farm,
            task,
            attempt,
            follow: false,
        });
        Box::pin(async move {
            let mut rx = rx.await;
            let (mut out, mut err) = (Vec::new(), Vec::new());
            loop {
                match rx.recv().await {
                    Some(ControlResponse::Log {
                        stdout,
                        stderr,
                        done,
                        ..
                    }) => {
                        out.extend(stdout);
                        err.extend(stderr);
                        if done {
                            break;
                        }
                    }
                    Some(ControlResponse::Error { message, .. }) => {
                        return Err(SourceError::Refused(message))
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            Ok(dash::logs_text(&out, &err))
        })
    }
}
