//! The engine over a `MemoryStore`, however it is given (`Idempotency::new`, `builder` with an
//! `Arc`, `from_arc` with an `Arc<dyn Store>`), calls the store's claims and completions directly
//! (`Store::immediate`): they never wait, so there is no future to box and run to its end. A
//! fresh call allocates what it keeps (the encoded result and the store's copy of it) and nothing
//! else; a replay, the copy of the stored result it decodes. A store that does not say it answers
//! at once (here the same store wrapped) goes through the `Store` trait's futures, which box each
//! operation (and the engine boxes it again, to finish it if the caller goes away).
//!
//! Allocations are counted by the process's allocator, so this binary holds this one test: no
//! other test thread allocates while it counts.

use std::alloc::System;
use std::sync::Arc;

use idem_core::store::{Forward, Forwarding};
use idem_core::{Error, Idempotency, Key, MemoryStore, Store};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: usize = 2_000;

/// Allocations per call of `CALLS` fresh calls, then of `CALLS` replays of the same keys.
async fn allocations_per_call(engine: &Idempotency, keys: &[Key]) -> (f64, f64) {
    let per_call = |region: &Region<'_, System>| region.change().allocations as f64 / CALLS as f64;
    let region = Region::new(GLOBAL);
    for (i, key) in keys.iter().enumerate() {
        let out = engine.call(*key).run(async { Ok::<_, Error>(i) }).await;
        assert!(!out.unwrap().is_replayed());
    }
    let fresh = per_call(&region);
    let region = Region::new(GLOBAL);
    for (i, key) in keys.iter().enumerate() {
        let out = engine.call(*key).run(async { Ok::<_, Error>(0) }).await;
        assert_eq!(out.unwrap().into_inner(), i);
    }
    (fresh, per_call(&region))
}

/// The memory store through the `Store` trait alone: it does not say it answers at once.
struct Awaited(MemoryStore);

impl Forward for Awaited {
    fn inner(&self) -> &dyn Store {
        &self.0
    }
}

#[test]
fn calls_on_the_memory_store_allocate_only_what_they_keep() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let keys = |name: &str| -> Vec<Key> {
            (0..CALLS)
                .map(|i| Key::derive("memory_path", name, &i.to_string()).unwrap())
                .collect()
        };
        let (direct_keys, built_keys, arc_keys, trait_keys) = (
            keys("new"),
            keys("builder"),
            keys("from_arc"),
            keys("trait"),
        );
        let direct = Idempotency::new(MemoryStore::new());
        let built = Idempotency::builder(Arc::new(MemoryStore::new()))
            .build()
            .unwrap();
        let from_arc = Idempotency::from_arc(Arc::new(MemoryStore::new()));
        let via_trait = Idempotency::new(Forwarding(Awaited(MemoryStore::new())));
        // Warm up: the first call of each engine sets up what later calls reuse (the scope's
        // metric handles, the store's shards).
        for engine in [&direct, &built, &from_arc, &via_trait] {
            let key = Key::derive("memory_path", "warm-up", "0").unwrap();
            engine
                .call(key)
                .run(async { Ok::<_, Error>(0) })
                .await
                .unwrap();
        }

        let (direct_fresh, direct_replay) = allocations_per_call(&direct, &direct_keys).await;
        let (built_fresh, built_replay) = allocations_per_call(&built, &built_keys).await;
        let (arc_fresh, arc_replay) = allocations_per_call(&from_arc, &arc_keys).await;
        let (trait_fresh, trait_replay) = allocations_per_call(&via_trait, &trait_keys).await;
        eprintln!(
            "allocations per call: new(MemoryStore) fresh {direct_fresh:.2} replay \
             {direct_replay:.2}; builder(Arc<MemoryStore>) fresh {built_fresh:.2} replay \
             {built_replay:.2}; from_arc(Arc<dyn Store>) fresh {arc_fresh:.2} replay \
             {arc_replay:.2}; through the trait fresh {trait_fresh:.2} replay {trait_replay:.2}"
        );
        // Fresh: the encoded result and the store's copy of it, plus the maps' amortised growth
        // (0.15 a call at this size). Replay: the copy of the stored result. A boxed future
        // would add a whole allocation a call.
        for (how, fresh, replay) in [
            ("new(MemoryStore)", direct_fresh, direct_replay),
            ("builder(Arc<MemoryStore>)", built_fresh, built_replay),
            ("from_arc(Arc<dyn Store>)", arc_fresh, arc_replay),
        ] {
            assert!(
                fresh < 2.5,
                "{how}: {fresh:.2} allocations per fresh call; 2 expected (the encoded result \
                 and the store's copy) plus growth, so something boxes a future again"
            );
            assert!(
                replay < 1.5,
                "{how}: {replay:.2} allocations per replay; 1 expected (the stored result's copy)"
            );
        }
        // Through the trait, each of the two store operations boxes its future twice.
        assert!(
            trait_fresh >= direct_fresh + 3.9,
            "through the trait: {trait_fresh:.2} allocations per fresh call against \
             {direct_fresh:.2}: the count no longer sees what the direct path skips"
        );
        assert!(trait_replay >= direct_replay + 1.9);
    });
}
