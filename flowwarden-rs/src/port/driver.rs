//! Plugging a backend into [`crate::run()`] and [`crate::Builder::start`] without naming it in
//! code: a [`BackendDriver`] configures a [`Backend`] from the environment (the MongoDB crate's
//! reads `FLOWWARDEN_MONGODB_URI`).
//!
//! A driver is found in this order: the drivers given to [`crate::Builder::driver`], then the
//! ones installed process-wide with [`install_driver`], then the ones a linked crate registered
//! with [`crate::register_backend_driver!`]. The first that answers `Some` wins; when none
//! does, the runtime uses the embedded in-memory backend (feature `memory`). Registration
//! needs the registering crate to be linked (reference one of its items); installing a driver
//! explicitly does not, which is why `flowwarden_rs_mongo::install_driver()` exists.

use std::sync::{Mutex, PoisonError};

use futures::future::BoxFuture;

use crate::backend::Backend;

/// What [`BackendDriver::configure`] returns: `None` when the environment does not ask for this
/// backend, else the connected backend or every problem found while connecting and validating.
pub type ProvidedBackend = BoxFuture<'static, Option<Result<Backend, Vec<String>>>>;

/// A backend that configures itself from the environment.
pub trait BackendDriver: Send + Sync + 'static {
    /// A short name for logs and errors (`"mongodb"`).
    fn name(&self) -> &'static str;

    /// `None` when the environment does not ask for this backend; otherwise the connected,
    /// validated backend, or every problem found.
    fn configure(&self) -> ProvidedBackend;
}

/// A driver registered by a linked crate through [`crate::register_backend_driver!`].
#[doc(hidden)]
pub struct DriverRegistration(pub &'static dyn BackendDriver);

inventory::collect!(DriverRegistration);

/// The variable that selects the MongoDB backend (read by `flowwarden-rs-mongo`'s driver);
/// the runtime names it when it is set and no driver is installed or registered.
pub const MONGODB_URI_VAR: &str = "FLOWWARDEN_MONGODB_URI";

static INSTALLED: Mutex<Vec<&'static dyn BackendDriver>> = Mutex::new(Vec::new());

/// Installs `driver` for every runtime of this process (after the builder's own drivers,
/// before registered ones). Installing the same driver twice has no further effect.
pub fn install_driver(driver: &'static dyn BackendDriver) {
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if !installed.iter().any(|d| d.name() == driver.name()) {
        installed.push(driver);
    }
}

/// Every driver a runtime consults, in order: `first` (the builder's), installed, registered.
pub(crate) fn drivers(first: &[&'static dyn BackendDriver]) -> Vec<&'static dyn BackendDriver> {
    let mut all: Vec<&'static dyn BackendDriver> = first.to_vec();
    let installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    let registered = inventory::iter::<DriverRegistration>
        .into_iter()
        .map(|r| r.0);
    for d in installed.iter().copied().chain(registered) {
        if !all.iter().any(|a| a.name() == d.name()) {
            all.push(d);
        }
    }
    all
}

/// Registers a [`BackendDriver`] (a `static` of a type implementing it) so that
/// [`crate::run()`] consults it whenever the registering crate is linked.
///
/// ```ignore
/// static DRIVER: MyDriver = MyDriver;
/// flowwarden::register_backend_driver!(DRIVER);
/// ```
#[macro_export]
macro_rules! register_backend_driver {
    ($driver:path) => {
        $crate::__private::inventory::submit! {
            $crate::port::DriverRegistration(&$driver)
        }
    };
}
