//! Fakes shared by the integration tests: a head whose "model" predicts the
//! next token through a map and records every call, and a runner stand-in
//! that drives a session the way the speculative decoder does.
#![allow(dead_code, unused_imports)]

pub(crate) mod fake;
pub(crate) mod sim;

pub(crate) use fake::{Call, FakeHead, Log, Model, OWN};
pub(crate) use sim::{Round, Sim};
