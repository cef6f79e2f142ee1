//! User code that shadows prelude names the generated code could otherwise pick up.
#![allow(dead_code, non_camel_case_types)]

use flowwarden::{change_stream, ChangeContext, ErrorAction, HandlerError};

type Result<T> = ::std::result::Result<T, ()>;
type Option = ();
type Box = u8;
type Vec = i32;
type Arc = ();
type bool = u8;
struct Some;
struct Ok;
struct Err;
struct None;
fn file() {}
mod core {}
mod std {}
mod flowwarden_private {}

#[derive(Default)]
pub struct Shadowed;

#[change_stream(collection = "shadowed")]
impl Shadowed {
    #[pipeline]
    fn stages() -> ::std::vec::Vec<bson::Document> {
        ::std::vec::Vec::new()
    }

    #[filter]
    fn keep(&self, _ctx: &ChangeContext<bson::Document>) -> ::core::primitive::bool {
        true
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) -> ::std::result::Result<(), HandlerError> {
        ::std::result::Result::Ok(())
    }

    #[on_update]
    fn updated(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_change]
    async fn rest(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_error]
    fn decide(&self, _e: &HandlerError, _ctx: &ChangeContext<bson::Document>) -> ErrorAction {
        ErrorAction::Retry
    }
}

fn main() {
    let _: Result<()> = ::std::result::Result::Ok(());
    let def = <Shadowed as flowwarden::StreamHandler>::definition();
    assert_eq!(def.name, "shadowed");
}
