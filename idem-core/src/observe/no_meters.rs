//! The engine's metrics in a build without the feature `metrics`: the API of `meters.rs`,
//! recording nothing, at no cost (a call's [`Meter`] is zero-sized).

use std::marker::PhantomData;
use std::time::Duration;

use super::{Scope, Stage};

/// Nothing to record without the `metrics` feature.
pub(crate) struct Meters;

impl Meters {
    pub(crate) fn new(_latencies_one_in: u32) -> Meters {
        Meters
    }
}

/// What a call's probe keeps of the engine's meters: nothing.
#[derive(Clone, Copy)]
pub(crate) struct Meter<'a>(PhantomData<&'a Meters>);

impl<'a> Meter<'a> {
    pub(crate) fn new(_meters: &'a Meters) -> Meter<'a> {
        Meter(PhantomData)
    }

    /// No call records latencies.
    pub(crate) fn sample(self) -> bool {
        false
    }

    pub(crate) fn claim_took(self, _scope: &Scope, _sampled: bool, _took: Duration) {}

    pub(crate) fn work_took(self, _scope: &Scope, _sampled: bool, _took: Duration) {}

    pub(crate) fn complete_took(self, _scope: &Scope, _sampled: bool, _took: Duration) {}

    pub(crate) fn claimed(self, _scope: &Scope) {}

    pub(crate) fn ended(self, _scope: &Scope, _stage: Stage, _in_flight: bool) {}
}

pub(crate) fn pruned(_target: &'static str, _deleted: u64) {}

pub(crate) fn dispatched(_name: &str, _published: u64, _failed: u64, _max_lag: Duration) {}
