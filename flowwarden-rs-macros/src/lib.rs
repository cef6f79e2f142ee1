//! Attribute macros of flowwarden-rs. Use them through the `flowwarden` crate, which
//! re-exports them; the code they generate names the runtime through
//! `flowwarden::__private` only.
//!
//! The macros parse, validate and generate; all behaviour lives in the runtime. Internally
//! each invocation goes through three phases:
//!
//! 1. **parse** (`attr`): each attribute's `key = value` list becomes typed values; unknown
//!    and repeated keys and values of the wrong kind are reported on their own token;
//! 2. **validate** (`model`, `sig`, `check`): the impl's methods and attributes become a
//!    validated model, with the rules that span several attributes;
//! 3. **generate** (`codegen`): code is produced from the model alone.
//!
//! Errors are collected (`ctxt`) so one build shows all of them, and the user's impl is
//! always emitted (stripped of these attributes) next to the errors.
//!
//! Set `FLOWWARDEN_MACRO_DEBUG=1` while building to print each `#[change_stream]` expansion
//! to stderr.

use proc_macro::TokenStream;

mod attr;
mod check;
mod codegen;
mod ctxt;
mod expand;
mod model;
mod naming;
mod placement;
mod sig;
mod symbol;

/// Turns `expand`'s result into tokens: on a fatal error the original item is emitted next to
/// the error, so one mistake does not cascade.
fn finish(
    item: proc_macro2::TokenStream,
    result: syn::Result<proc_macro2::TokenStream>,
) -> TokenStream {
    match result {
        Ok(tokens) => tokens.into(),
        Err(err) => placement::with_error(item, err).into(),
    }
}

/// Declares a change stream on an `impl` block whose methods are its handlers.
///
/// ```ignore
/// use flowwarden::{change_stream, ChangeContext, HandlerError};
///
/// #[derive(Default)]
/// struct OrderStream;
///
/// #[change_stream(collection = "orders", document = Order)]
/// impl OrderStream {
///     #[on_insert]
///     async fn created(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// ```
///
/// The macro implements `flowwarden::StreamHandler` for the type, emits a static
/// `StreamDefinition`, and registers the stream so that `flowwarden::run()` finds it. The
/// type must be a concrete (non-generic) type that is `Send + Sync + 'static`; when it also
/// implements `Default`, the runtime builds it by itself.
///
/// # Keys
///
/// ## `name = "..."`
/// The stream's unique name: the checkpoint key, the metrics label, the log field.
/// Default: the type's name in kebab case (`OrderStream` → `"order-stream"`).
///
/// ## `collection = "..."`
/// The collection to watch. Required unless `document` is set, in which case it defaults to
/// `<T as flowwarden::CollectionName>::COLLECTION`.
///
/// ## `database = "..."`
/// The database to watch. Default: the client's default database.
///
/// ## `document = Type`
/// The type `fullDocument` decodes into (a type path, no quotes; it must implement
/// `serde::de::DeserializeOwned`). Default: none — the stream's document is a
/// `bson::Document`, and handlers read it through the context instead of asking for it as a
/// parameter.
///
/// ## `full_document = "updateLookup" | "whenAvailable" | "required"`
/// Whether update events carry the document. Default: the server's default (updates carry
/// none). An `#[on_update]` handler may take `T` only with `"updateLookup"` or `"required"`,
/// and `Option<T>` with `"whenAvailable"`.
///
/// ## `full_document_before_change = "whenAvailable" | "required" | "off"`
/// Whether events carry the pre-image (`ctx.document_before_change()`). Default: `"off"`.
///
/// ## `enabled = bool`
/// A disabled stream is registered and validated but never started. Default: `true`.
///
/// ## `auto_start = bool`
/// When `false`, the stream waits for an explicit start. Default: `true`.
///
/// ## `crate = "path"`
/// The path of the runtime crate, when it is renamed or re-exported. Default: `"flowwarden"`.
///
/// # Companion attributes
///
/// `#[checkpoint(..)]`, `#[retry(..)]` and `#[restart(..)]` configure the same stream and may
/// be written above or below `#[change_stream]`.
///
/// # Method attributes
///
/// `#[on_insert]`, `#[on_update]`, `#[on_replace]`, `#[on_delete]`, `#[on_change]` (every
/// operation without a typed handler), `#[pipeline]`, `#[filter]`, `#[on_error]` and `#[key]`
/// (with `concurrency = N > 1`). Several handler attributes may be stacked on one method.
/// Handlers are `async fn` or plain `fn` (run on the blocking pool), take `&self` and then
/// `(ctx: &ChangeContext<T>)`, `(doc: T)`, `(doc: T, ctx: &ChangeContext<T>)` or the same with
/// `Option<T>`, and return `()` or `Result<(), E>` with `E: Into<HandlerError>`.
///
/// See `docs/attributes.md` for every rule and the equivalent code without the macro, and
/// `docs/errors.md` for the compile errors.
#[proc_macro_attribute]
pub fn change_stream(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    let debug = expand::debug_enabled().then(|| expand::impl_name(&item));
    let out = finish(item.clone(), expand::change_stream(args.into(), item));
    if let Some(name) = debug {
        expand::debug_print(&name, &proc_macro2::TokenStream::from(out.clone()));
    }
    out
}

/// Checkpoint cadence and resume behaviour of a `#[change_stream]` impl.
///
/// ```ignore
/// #[change_stream(collection = "orders")]
/// #[checkpoint(save_every_n = 5, save_interval_secs = 10, start_position = Resume)]
/// impl OrderStream { /* .. */ }
/// ```
///
/// # Keys
///
/// ## `save_every_n = u32`
/// Write the processed checkpoint after this many handled events. At least 1. Default: `1`.
///
/// ## `save_interval_secs = u64`
/// Heartbeat: write the latest settled position this often; `0` disables it. Default: `5`.
///
/// ## `start_position = Resume | Latest | Snapshot`
/// `Resume` resumes from the stored checkpoint (or starts at "now" when none is stored);
/// `Latest` ignores stored checkpoints; `Snapshot` reads the collection's existing documents
/// on the first start (each handed to the insert handler as a snapshot read), then streams
/// from a position recorded before the scan. `Snapshot` needs an `#[on_insert]` or
/// `#[on_change]` handler. Default: `Resume`.
///
/// ## `on_history_lost = Fail | ResumeFromOplogStart | ResumeFromNow`
/// What to do when every stored token is older than the retained history. Default: `Fail`.
///
/// ## `resume_strategy = ProcessedFirst | SeenFirst`
/// Which stored token the resume tries first. Default: `ProcessedFirst`.
///
/// Values are identifiers or strings; case and `_` are ignored (`"RESUME_FROM_NOW"` works).
/// The attribute is read by `#[change_stream]`; used anywhere else it is a compile error.
#[proc_macro_attribute]
pub fn checkpoint(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    finish(
        item.clone(),
        placement::companion(symbol::CHECKPOINT, args.into(), item),
    )
}

/// Retry policy of a failing handler, before its event is dead-lettered.
///
/// ```ignore
/// #[change_stream(collection = "orders")]
/// #[retry(max_attempts = 5, initial_delay_ms = 200, multiplier = 2.0, max_delay_ms = 10000)]
/// impl OrderStream { /* .. */ }
/// ```
///
/// # Keys
///
/// ## `max_attempts = u32`
/// Attempts in all, the first try included. At least 1. Default: `3`.
///
/// ## `initial_delay_ms = u64`
/// Delay before the second attempt. At most `max_delay_ms`. Default: `500`.
///
/// ## `multiplier = f64`
/// Growth factor of the delay. At least `1.0`. Default: `2.0`.
///
/// ## `max_delay_ms = u64`
/// Upper bound of one delay. Default: `30000`.
///
/// ## `jitter = bool`
/// Randomise each delay between half and all of its value. Default: `true`.
#[proc_macro_attribute]
pub fn retry(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    finish(
        item.clone(),
        placement::companion(symbol::RETRY, args.into(), item),
    )
}

/// Backoff for re-opening a stream whose cursor died.
///
/// # Keys
///
/// ## `max_attempts = u32`
/// Consecutive failed re-opens before the stream halts; `0` means unlimited. Default: `0`.
///
/// ## `initial_delay_ms = u64`
/// First delay; never zero. Default: `1000`.
///
/// ## `max_delay_ms = u64`
/// Upper bound of one delay; never zero. Default: `60000`.
#[proc_macro_attribute]
pub fn restart(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    finish(
        item.clone(),
        placement::companion(symbol::RESTART, args.into(), item),
    )
}

macro_rules! method_attribute {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Only valid on a method of an `impl` block marked `#[change_stream(..)]`, which reads
        /// and removes it; anywhere else it is a compile error.
        #[proc_macro_attribute]
        pub fn $name(_args: TokenStream, item: TokenStream) -> TokenStream {
            let item = proc_macro2::TokenStream::from(item);
            finish(item.clone(), placement::method_attr(stringify!($name), item))
        }
    };
}

method_attribute!(
    /// Handles `insert` events. The event always carries the document, so the handler may
    /// take `T` (or `Option<T>`) and/or `&ChangeContext<T>`.
    on_insert
);
method_attribute!(
    /// Handles `update` events. Taking `T` needs `full_document = "updateLookup"` or
    /// `"required"`; with `"whenAvailable"` take `Option<T>`; otherwise take the context and
    /// read `ctx.update_description()`.
    on_update
);
method_attribute!(
    /// Handles `delete` events. A delete carries no document: take only the context
    /// (`ctx.document_key()`, `ctx.document_before_change()`).
    on_delete
);
method_attribute!(
    /// Handles `replace` events. The event always carries the document.
    on_replace
);
method_attribute!(
    /// The catch-all: handles every operation without a typed handler, including `drop`,
    /// `rename`, `dropDatabase`, `invalidate` and operation types the runtime does not know.
    /// Takes the context, or `Option<T>`.
    on_change
);
method_attribute!(
    /// The server-side stages that follow `$changeStream`: an associated function without
    /// `self` or parameters returning `Vec<bson::Document>`. At most one per stream.
    pipeline
);
method_attribute!(
    /// The client-side filter, run before dispatch:
    /// `fn(&self, ctx: &ChangeContext<T>) -> bool`, not async. `false` settles the event
    /// unhandled. At most one per stream; not combinable with `#[on_delete]`.
    filter
);
method_attribute!(
    /// Orders events by a key of the user's choice instead of their `documentKey`, with
    /// `#[change_stream(concurrency = N)]` and `N > 1` (with `concurrency = 1` it is a compile
    /// error): `fn(&self, ctx: &ChangeContext<T>) -> K` where `K: Hash`, not async. Events whose
    /// keys are equal run one at a time in stream order; different keys run in parallel.
    /// Events without a document key (`drop`, `rename`, `dropDatabase`, `invalidate`, unknown
    /// types) stay barriers and the method is not called for them; an event whose document does
    /// not decode into `T` is ordered by its `documentKey`. At most one per stream.
    key
);
method_attribute!(
    /// Decides what happens after a failed attempt:
    /// `fn(&self, error: &HandlerError, ctx: &ChangeContext<T>) -> ErrorAction`, not async.
    /// At most one per stream.
    on_error
);
