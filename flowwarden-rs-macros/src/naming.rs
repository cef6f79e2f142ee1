//! The default stream name: the type's name in kebab case.

/// `OrderStream` → `order-stream`, `HTTPEvents` → `http-events`, `V2Orders` → `v2-orders`,
/// `order_stream` → `order-stream`.
pub(crate) fn kebab_case(ident: &str) -> String {
    let ident = ident.strip_prefix("r#").unwrap_or(ident);
    let chars: Vec<char> = ident.chars().collect();
    let mut out = String::with_capacity(ident.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' || c == '-' {
            if !out.is_empty() && !out.ends_with('-') {
                out.push('-');
            }
            continue;
        }
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            let boundary = prev.is_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_uppercase() && next_is_lower);
            if boundary && !out.ends_with('-') {
                out.push('-');
            }
        }
        out.extend(c.to_lowercase());
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::kebab_case;

    #[test]
    fn kebab() {
        assert_eq!(kebab_case("OrderStream"), "order-stream");
        assert_eq!(kebab_case("Orders"), "orders");
        assert_eq!(kebab_case("HTTPEvents"), "http-events");
        assert_eq!(kebab_case("V2Orders"), "v2-orders");
        assert_eq!(kebab_case("order_stream"), "order-stream");
        assert_eq!(kebab_case("PaidOrderAudit"), "paid-order-audit");
        assert_eq!(kebab_case("r#Type"), "type");
    }
}
