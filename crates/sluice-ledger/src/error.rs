//! The ledger's error: what failed while building or recording the step.

/// What can go wrong while recording a step's ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A setting the ledger cannot model, or a build without the op ledger.
    #[error("{0}")]
    Msg(String),
    /// The synthetic batch could not be transferred.
    #[error("transfer: {0}")]
    Transfer(#[source] Box<sluice_core::Error>),
    /// A batch slot or a readback failed.
    #[error(transparent)]
    Core(Box<sluice_core::Error>),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(Box<candle_core::Error>),
    /// The model could not be built or run.
    #[error(transparent)]
    Model(Box<sluice_model::ModelError>),
    /// The optimizer step failed.
    #[error(transparent)]
    Optim(Box<sluice_optim::OptimError>),
    /// The loss or the validation batch failed.
    #[error(transparent)]
    Infer(Box<sluice_infer::InferError>),
    /// The validation batch's output could not be packed.
    #[error(transparent)]
    Eval(Box<sluice_eval::Error>),
}

impl LedgerError {
    /// A failed transfer of the synthetic batch.
    pub(crate) fn transfer(e: sluice_core::Error) -> Self {
        Self::Transfer(Box::new(e))
    }
}

// Causes boxed, so that the error stays small.
sluice_core::boxed_from!(LedgerError {
    Core: sluice_core::Error,
    Candle: candle_core::Error,
    Model: sluice_model::ModelError,
    Optim: sluice_optim::OptimError,
    Infer: sluice_infer::InferError,
    Eval: sluice_eval::Error,
});

/// This crate's result type.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;
