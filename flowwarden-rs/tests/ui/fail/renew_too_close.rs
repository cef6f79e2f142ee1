use flowwarden::{change_stream, ChangeContext};

#[derive(Default)]
struct Leader;

#[change_stream(collection = "orders", deployment = SingleLeader, lease_secs = 10, renew_secs = 8)]
impl Leader {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct Everyone;

#[change_stream(collection = "orders", lease_secs = 10)]
impl Everyone {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
