//! The `auto` backend: `comm_select::auto` over every backend of its registry that starts
//! on every rank, plus the mode's default backends that it cannot start from a bootstrap
//! alone (`local` in-process, `mpi` under MPI).

use comm_core::Result;
use comm_select::{Auto, SelectComm};

use super::{RankContext, defaults};

/// Collective: builds rank `ctx`'s selector (see the module docs).
pub fn create_select(ctx: &RankContext) -> Result<SelectComm> {
    let mut auto = Auto::new(ctx.bootstrap().clone());
    for b in defaults(ctx.mode()) {
        if !b.in_library() && b.name != "auto" {
            auto = auto.with_member(b.create(ctx)?);
        }
    }
    auto.build()
}
