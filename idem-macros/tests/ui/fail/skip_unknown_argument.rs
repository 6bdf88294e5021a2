// A name in `skip(…)` that is not an argument is reported on that name, with the arguments that
// exist (the receiver is none of them).
use idem::{idempotent, Idempotency};

struct Shop {
    idem: Idempotency,
}

impl Shop {
    #[idempotent(key = id, engine = self.idem, skip(clinet))]
    async fn order(&self, id: &str, client: &str, cents: u64) -> Result<u64, idem::Error> {
        let _ = (id, client);
        Ok(cents)
    }
}

fn main() {}
