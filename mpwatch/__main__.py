from mpwatch.show.cli import main

raise SystemExit(main())
