//! The pruner a SQL store runs while it lives: [`Pruner::records`] on the store, spawned on
//! connect unless the builder opts out, stopped when the last clone of the store is dropped.

use std::sync::Arc;

use idem_core::store::support::check_pruner_config;
use idem_core::Error;
use idem_core::Store;
use idem_core::{Pruner, PrunerConfig, PrunerHandle};

/// A store's background pruner, shared by its clones. The handle stops the pruner when it is
/// dropped (after the batch in progress, releasing its lease), so the last clone of the store to
/// go takes the task with it.
pub(crate) type Background = Option<Arc<PrunerHandle>>;

/// Refuses a bad `config` before the store opens anything, and a missing tokio runtime before
/// [`spawn`] would panic on it.
pub(crate) fn check(config: Option<&PrunerConfig>) -> Result<(), Error> {
    let Some(config) = config else {
        return Ok(());
    };
    check_pruner_config(config)?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::InvalidConfig(
            "the store's background pruner runs on tokio, but no tokio runtime is running: \
             connect inside one, or opt out with `.pruner(None)`"
                .to_owned(),
        ));
    }
    Ok(())
}

/// Spawns `config`'s pruner of `store`'s expired records. `store` must hold no [`Background`]
/// itself: the pruner keeps it alive, so a handle inside it would never be dropped.
pub(crate) fn spawn(store: impl Store, config: Option<PrunerConfig>) -> Result<Background, Error> {
    let Some(config) = config else {
        return Ok(None);
    };
    check(Some(&config))?;
    Ok(Some(Arc::new(Pruner::records(store, config)?.spawn())))
}
