//! The paths of idem-server's routes. Each takes `POST` with its request body (the health
//! ping takes `GET` too and no body); the crate's table pairs each with its body types.
//!
//! ```
//! assert_eq!(idem_wire::route::START, "/api/v1.idempotency.start");
//! assert_eq!(idem_wire::route::STEPS_WRITE, "/api/v1.idempotency.steps.write");
//! ```

/// Diom's `start`: claim a key, or get its stored response ([`StartIn`](crate::StartIn) →
/// [`StartOut`](crate::StartOut)).
pub const START: &str = "/api/v1.idempotency.start";
/// Diom's `complete`: store a key's response ([`CompleteIn`](crate::CompleteIn) →
/// [`Empty`](crate::Empty)).
pub const COMPLETE: &str = "/api/v1.idempotency.complete";
/// Diom's `abort`: release a claim so a retry may run ([`AbortIn`](crate::AbortIn) →
/// [`Empty`](crate::Empty)).
pub const ABORT: &str = "/api/v1.idempotency.abort";
/// Fenced extension: extend a claim's lock ([`RenewIn`](crate::RenewIn) →
/// [`Empty`](crate::Empty)).
pub const RENEW: &str = "/api/v1.idempotency.renew";
/// Fenced extension: read a key's record ([`KeyIn`](crate::KeyIn) →
/// [`GetOut`](crate::GetOut)).
pub const GET: &str = "/api/v1.idempotency.get";
/// Fenced extension: delete a key's record ([`KeyIn`](crate::KeyIn) →
/// [`EvictOut`](crate::EvictOut)).
pub const EVICT: &str = "/api/v1.idempotency.evict";
/// Fenced extension, admin token: delete ended records ([`PruneIn`](crate::PruneIn) →
/// [`PruneOut`](crate::PruneOut)).
pub const PRUNE: &str = "/api/v1.idempotency.prune";
/// Fenced extension: begin or resume an operation's steps
/// ([`StepsBeginIn`](crate::StepsBeginIn) → [`StepsOut`](crate::StepsOut)).
pub const STEPS_BEGIN: &str = "/api/v1.idempotency.steps.begin";
/// Fenced extension: store that a step begins, or its result
/// ([`StepWriteIn`](crate::StepWriteIn) → [`Empty`](crate::Empty)).
pub const STEPS_WRITE: &str = "/api/v1.idempotency.steps.write";
/// Fenced extension: take over the caller's uncertain key to resolve it
/// ([`TakeUncertainIn`](crate::TakeUncertainIn) → [`TakeUncertainOut`](crate::TakeUncertainOut)).
pub const UNCERTAIN_TAKE: &str = "/api/v1.idempotency.uncertain.take";
/// Fenced extension: the caller's uncertain keys in a namespace, by key
/// ([`FindUncertainIn`](crate::FindUncertainIn) → [`FindUncertainOut`](crate::FindUncertainOut)).
pub const UNCERTAIN_FIND: &str = "/api/v1.idempotency.uncertain.find";
/// Fenced extension, admin token: every uncertain operation, by store key
/// ([`ListUncertainIn`](crate::ListUncertainIn) → [`ListUncertainOut`](crate::ListUncertainOut)).
pub const UNCERTAIN_LIST: &str = "/api/v1.idempotency.uncertain.list";
/// Fenced extension, admin token: resolve an uncertain operation as completed, failed or
/// abandoned ([`ResolveIn`](crate::ResolveIn) → [`Empty`](crate::Empty)).
pub const UNCERTAIN_RESOLVE: &str = "/api/v1.idempotency.uncertain.resolve";
/// Diom's namespace configuration, admin token
/// ([`ConfigureNamespaceIn`](crate::ConfigureNamespaceIn) →
/// [`NamespaceOut`](crate::NamespaceOut)).
pub const NAMESPACE_CONFIGURE: &str = "/api/v1.idempotency.namespace.configure";
/// Diom's namespace read, admin token ([`GetNamespaceIn`](crate::GetNamespaceIn) →
/// [`NamespaceOut`](crate::NamespaceOut)).
pub const NAMESPACE_GET: &str = "/api/v1.idempotency.namespace.get";
/// Diom's health ping, `GET` or `POST`, no token ([`PingOut`](crate::PingOut)).
pub const PING: &str = "/api/v1.health.ping";
