//! The registry of streams declared with `#[change_stream]`, collected through `inventory`.

use std::any::TypeId;

use crate::definition::StreamDefinition;
use crate::engine::AnyStream;

/// One registered stream, submitted by the code `#[change_stream]` generates.
#[doc(hidden)]
pub struct Registration {
    /// The stream's static definition.
    pub definition: fn() -> &'static StreamDefinition,
    /// Builds the handler with `Default`, or `None` when the type has no `Default`.
    pub build_default: fn() -> Option<AnyStream>,
    /// The handler type's id, to match instances given to the builder.
    pub type_id: fn() -> TypeId,
}

inventory::collect!(Registration);

/// Every stream registered in this binary, in registration order.
pub(crate) fn registered() -> impl Iterator<Item = &'static Registration> {
    inventory::iter::<Registration>.into_iter()
}
