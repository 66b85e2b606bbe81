from django.core.management.base import BaseCommand

from exchange.dashboard.activity import activity_fold, activity_rebuild


class Command(BaseCommand):
    help = (
        "Fold new postings into the dashboard's daily activity rollup; with --rebuild, recompute it "
        "from the whole journal (exchange/dashboard/activity.py)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--rebuild", action="store_true", help="Empty the rollup and fold the whole journal.")

    def handle(self, *args, rebuild: bool = False, **options):
        moved = activity_rebuild() if rebuild else activity_fold()
        self.stdout.write(f"folded through {moved} posting ids")
