//! The crate's error type: every failure names the node or option it concerns.

/// Errors of the export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A tensor of the model could not be read.
    #[error("reading the weights of `{node}`: {source}")]
    Tensor {
        /// The node whose weights were read.
        node: String,
        /// What went wrong.
        source: sluice_model::candle_core::Error,
    },
    /// The model could not describe its graph.
    #[error("the model's graph: {0}")]
    Model(#[from] sluice_model::ModelError),
    /// An option the export cannot honour.
    #[error("{0}")]
    Options(String),
    /// A graph the writer does not know how to write.
    #[error("node `{node}`: {reason}")]
    Unsupported {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, ExportError>;
