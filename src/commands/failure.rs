//! How a command fails, and which exit status that is.

use crate::config::ConfigError;
use crate::schema::SchemaProblem;

/// How a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad settings or a missing schema: exit status 2.
    #[error("{0}")]
    Config(String),
    /// A statement waited in vain for a lock another session holds (the database's words, and
    /// how long it waited: [`crate::db::COMMAND_LOCK_TIMEOUT`] unless it bounds its own wait):
    /// exit status 1, said with the sessions that hold it by `lock_wait::bounded`.
    #[error("{0}")]
    LockWait(String, std::time::Duration),
    /// Anything else: exit status 1.
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl Failure {
    /// A wait of [`crate::db::COMMAND_LOCK_TIMEOUT`] for a lock, in vain.
    pub fn lock_wait(e: &tokio_postgres::Error) -> Failure {
        Failure::LockWait(crate::db::describe(e), crate::db::COMMAND_LOCK_TIMEOUT)
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(e.to_string())
    }
}

impl From<SchemaProblem> for Failure {
    fn from(e: SchemaProblem) -> Self {
        match e {
            SchemaProblem::Db(e) if crate::db::is_lock_wait(&e) => Failure::lock_wait(&e),
            SchemaProblem::Db(e) => Failure::Other(anyhow::anyhow!(crate::db::describe(&e))),
            other => Failure::Config(other.to_string()),
        }
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(e: crate::store::StoreError) -> Self {
        if let crate::store::StoreError::Db(db) = &e
            && crate::db::is_lock_wait(db)
        {
            return Failure::lock_wait(db);
        }
        // Its message already holds the database's, which its sources would say again.
        Failure::Other(anyhow::anyhow!("{e}"))
    }
}

impl From<crate::relay::DrainError> for Failure {
    fn from(e: crate::relay::DrainError) -> Self {
        match e {
            crate::relay::DrainError::Store(e) => e.into(),
            // Its message says what happened and what to do.
            other => Failure::Other(anyhow::anyhow!("{other}")),
        }
    }
}
