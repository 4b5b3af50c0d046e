//! The node's home room: the farms submitted here and what their users ask of them (control requests, submissions, reuse and set-aside, views, the feed of tasks, queries, growth, logs, export, the allocation queues).

mod alloc;
mod commands;
mod export;
mod feed;
mod grow;
mod logs;
mod queries;
mod submit;
mod views;

pub(super) use alloc::Alloc;
pub(super) use commands::{accept_control, serve_control};
pub(super) use grow::GrowError;
pub(super) use queries::Asked;
pub(super) use views::Origin;
