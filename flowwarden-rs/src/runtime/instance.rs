//! This process's identity among the replicas of a service.

/// This process's identity among the instances of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceId {
    id: String,
    configured: bool,
}

impl InstanceId {
    /// A configured identity.
    pub fn configured(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            configured: true,
        }
    }

    /// `FLOWWARDEN_INSTANCE_ID` when set, else host name, process id and a random suffix (two
    /// processes on one host never share it).
    pub fn from_env() -> Self {
        match std::env::var("FLOWWARDEN_INSTANCE_ID") {
            Ok(id) if !id.trim().is_empty() => Self::configured(id.trim()),
            _ => Self::generated(),
        }
    }

    /// Test-only (feature `test-util`): `id`, treated as generated (not configured), so a
    /// deterministic test can run the unconfigured-identity paths with a known identity.
    #[cfg(feature = "test-util")]
    pub fn unconfigured(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            configured: false,
        }
    }

    /// A generated identity: `host-pid-suffix`.
    pub fn generated() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "host".into());
        // RandomState is seeded randomly per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let suffix = h.finish() & 0xFF_FFFF;
        Self {
            id: format!("{host}-{}-{suffix:06x}", std::process::id()),
            configured: false,
        }
    }

    /// The identity.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// Whether it was configured (stable across restarts) rather than generated.
    pub fn is_configured(&self) -> bool {
        self.configured
    }
}

impl std::fmt::Display for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_identities_differ_and_are_not_configured() {
        let a = InstanceId::generated();
        let b = InstanceId::generated();
        assert_ne!(a, b, "random suffix");
        assert!(!a.is_configured());
        assert!(a.as_str().contains(&std::process::id().to_string()));
        assert!(InstanceId::configured("pod-1").is_configured());
    }
}
