//! What this binary is: the crate's version and the git revision it was built from (`build.rs`
//! finds it; `unknown` where the build had neither git nor `FGA_RELAY_GIT_REVISION`).

/// The crate's version, as Cargo.toml and the CHANGELOG say it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git revision (12 hex digits), the build argument given for it, or `unknown`.
pub const REVISION: &str = env!("FGA_RELAY_BUILD_REVISION");

/// What `fga-relay --version` prints after the name: `0.2.0 (revision 1a2b3c4d5e6f)`.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("FGA_RELAY_BUILD_REVISION"),
    ")"
);
