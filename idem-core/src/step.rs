//! What a store keeps of an operation's steps: one record per (operation key, step name), and
//! per operation the number of attempts that ran its steps. The engine's
//! [`Steps`](crate::Steps) handle reads and writes them through [`Store`](crate::Store)'s step
//! methods; docs/steps.md says what they promise.

/// One step of an operation as a store keeps it, keyed by the operation's key and
/// [`name`](Self::name).
///
/// ```
/// use idem_core::{StepRecord, StepState};
/// let charged = StepRecord { name: "charge".into(), position: 1, state: StepState::Finished(b"\"ch_1\"".to_vec()) };
/// assert!(matches!(charged.state, StepState::Finished(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// The step's name, unique within its operation.
    pub name: String,
    /// Where the step came in its operation: 0 for the first step the work ran.
    pub position: u32,
    /// Begun, or finished with its result.
    pub state: StepState,
}

/// Whether a step has its result.
///
/// ```
/// use idem_core::StepState;
/// assert_ne!(StepState::Begun, StepState::Finished(Vec::new()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState {
    /// An at-most-once step was about to run and its result was never stored: the attempt that
    /// began it stopped inside it (or failed before storing it).
    Begun,
    /// The step's result, encoded by the engine's codec.
    Finished(Vec<u8>),
}

/// What [`Store::begin_steps`](crate::Store::begin_steps) found: which attempt this claim is,
/// and the steps stored so far, in the order they ran.
///
/// ```
/// use idem_core::StepLog;
/// let first = StepLog { attempt: 1, steps: Vec::new() };
/// assert!(first.steps.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLog {
    /// 1 for the first claim that ran this operation's steps, 2 for the next, and so on.
    pub attempt: u32,
    /// The stored steps, by position.
    pub steps: Vec<StepRecord>,
}

impl StepLog {
    /// What a first attempt finds: attempt 1, no steps.
    pub(crate) fn first() -> StepLog {
        StepLog {
            attempt: 1,
            steps: Vec::new(),
        }
    }
}

/// A step to store: that it begins (an at-most-once step, before it runs) or its result.
///
/// ```
/// use idem_core::StepWrite;
/// let begun = StepWrite { name: "charge", position: 1, result: None };
/// assert!(begun.result.is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepWrite<'a> {
    /// The step's name.
    pub name: &'a str,
    /// Its position in the operation.
    pub position: u32,
    /// `None` to record that it begins; `Some` with its encoded result once it finished.
    pub result: Option<&'a [u8]>,
}

/// The longest step name, in bytes: names are stored next to each operation's key.
pub const MAX_STEP_NAME_LEN: usize = 255;
