//! A stand-in for OpenFGA's HTTP API, for the relay's tests and its benchmark.
//!
//! No OpenFGA server can run here, so this module answers as OpenFGA does, byte for byte where
//! the source code tells us how, and never more lenient than OpenFGA. Every behaviour was read
//! from the OpenFGA sources (openfga/openfga `da9354f7e670`, openfga/api `f153694bfc20`); the
//! file and function are cited where it helps.
//!
//! What it serves: `POST /stores/{id}/write`, `POST /stores/{id}/read`,
//! `GET /stores/{id}`, `GET /stores`, `GET /healthz`. Anything else gets the gateway's 404s.
//! There is one store, [`STORE_ID`], named [`STORE_NAME`], whose one model is [`MODEL_ID`].
//!
//! How a request travels, in OpenFGA's order:
//! 1. grpc-gateway decodes the JSON body (Go `encoding/json` first, then `protojson` with
//!    `DiscardUnknown`), and takes `store_id` from the path.
//! 2. gRPC rejects a request whose protobuf encoding exceeds `512*1204` bytes.
//! 3. The PGV validator runs with `ValidateAll`; it runs *before*
//!    authentication (openfga `cmd/run/run.go`: the `grpcauth` interceptor is chained last).
//! 4. Authentication.
//! 5. Injected faults (write requests only; not something OpenFGA does).
//! 6. The handler: for Write, `Server.Write` then `WriteCommand.Execute`.
//!
//! The server runs on its own thread with its own tokio runtime, so it keeps answering while a
//! test blocks its own thread. It serves HTTP/1.1 connections itself (hyper's
//! `serve_connection`), which lets it drop one connection without answering
//! ([`Fault::CloseConnection`]) and stop listening on its port ([`FakeFga::set_refusing`]).
//! Dropping the [`FakeFga`] stops the runtime, which ends every connection, hanging ones
//! included, and joins the thread.
//!
//! Where things are:
//! - `handle`: [`FakeFga`] as a test holds it; `server`: listening and connections; `routes`:
//!   the gateway's routes and the answer every handler builds.
//! - `store`: tuples, recorded writes, the changelog, shared state; `model`: the authorization
//!   model; `hasher`: the write path's fast hasher.
//! - `decode` (with `schema`, `fastjson`): requests as grpc-gateway and protojson decode them;
//!   `gojson`: Go `encoding/json`'s scanner and its error texts.
//! - `request_validation`: PGV; `auth`: authentication; `faults`: injected faults;
//!   `tuple_validation`: tuples against the model.
//! - `write`, `read`, `stores`: the handlers; `errors`: how OpenFGA encodes an error;
//!   `encoding`: JSON text, protobuf sizes, timestamps, continuation tokens.

mod auth;
mod decode;
mod encoding;
mod errors;
mod fastjson;
mod faults;
mod gojson;
mod handle;
mod hasher;
mod model;
mod read;
mod request_validation;
mod routes;
mod schema;
mod server;
mod store;
mod stores;
mod tuple_validation;
mod write;

pub use faults::{Fault, FaultRule, RandomFaults};
pub use handle::FakeFga;
pub use model::Model;
pub use store::{Change, Op, StoredTuple, WriteRecord};

use auth::*;
use decode::*;
use encoding::*;
use errors::*;
use hasher::*;
use request_validation::*;
use routes::*;
use server::*;
use store::*;
use tuple_validation::*;

/// The one store. 26 characters of `[ABCDEFGHJKMNPQRSTVWXYZ0-9]` (no I, L, O, U), as the
/// `store_id` PGV pattern requires.
pub const STORE_ID: &str = "01JRE1AYTESTST0RE000000000";
/// The store's one authorization model (same pattern).
pub const MODEL_ID: &str = "01JRE1AYTESTM0DE1000000000";
/// The store's name, as ListStores and GetStore return it.
pub const STORE_NAME: &str = "relay-test";
/// OpenFGA's default `maxTuplesPerWrite`.
pub const DEFAULT_MAX_TUPLES_PER_WRITE: usize = 100;

/// gRPC's `MaxRecvMsgSize`: `serverconfig.DefaultMaxRPCMessageSizeInBytes = 512*1204`.
const MAX_RECV_MSG_SIZE: usize = 512 * 1204;
/// `DefaultWriteContextByteLimit = 32*1024`.
const CONDITION_CONTEXT_BYTE_LIMIT: usize = 32 * 1024;
/// `storage.DefaultPageSize` for Read and ListStores.
const DEFAULT_PAGE_SIZE: usize = 50;
/// `AuthorizationModelIDHeader`.
const MODEL_ID_HEADER: &str = "openfga-authorization-model-id";
/// `requestid.RequestIDHeader`, set on every gRPC answer (openfga `pkg/middleware/requestid`).
const REQUEST_ID_HEADER: &str = "x-request-id";
/// The service name the health checker answers for (openfga `pkg/server/health/health.go`).
const HEALTH_SERVICE: &str = "openfga.v1.OpenFGAService";

// PGV reasons, exactly as the generated Go code writes them (api: `*.pb.validate.go`). The
// patterns are printed with doubled backslashes there, so they are here too.
const ULID_REASON: &str =
    r#"value does not match regex pattern "^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$""#;
const RELATION_REASON: &str = r#"value does not match regex pattern "^[^:#@\\s]{1,50}$""#;
const OBJECT_REASON: &str = r#"value does not match regex pattern "^[^\\s]{2,256}$""#;
const CONDITION_NAME_REASON: &str = r#"value does not match regex pattern "^[^\\s]{2,256}$""#;
const READ_USER_REASON: &str =
    r#"value does not match regex pattern "^[^\\s]{1,511}:[^\\s]{1,511}$""#;
const TOKEN_REASON: &str = r#"value does not match regex pattern "^$|^[A-Za-z0-9-_]+={0,2}$""#;
const STORE_NAME_REASON: &str =
    r#"value does not match regex pattern "^[a-zA-Z0-9\\s\\.\\-\\/^_&@]{3,64}$""#;
const USER_LENGTH_REASON: &str = "value length must be at most 512 bytes";
const MIN_ITEMS_REASON: &str = "value must contain at least 1 item(s)";
const PAGE_SIZE_REASON: &str = "value must be inside range [1, 100]";
