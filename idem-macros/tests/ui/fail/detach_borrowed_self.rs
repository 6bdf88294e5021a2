// `detach = true` on a `&self` method whose body uses `self`: the error is on `&self` and says
// to take `self: Arc<Self>`.
use idem::{idempotent, Idempotency};

struct Shop {
    idem: Idempotency,
    name: String,
}

impl Shop {
    #[idempotent(key = id, engine = self.idem, detach = true)]
    async fn order(&self, id: String) -> Result<String, idem::Error> {
        Ok(format!("{}: {id}", self.name))
    }
}

fn main() {}
